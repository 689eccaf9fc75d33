// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Two-dimensional channel state (issue 14, form 7): linear attention / RetNet,
// S[d, e] = gamma * S[d, e] + k[t, d] * v[t, e], read out as out[t, e] = sum_d q[t, d] *
// S[d, e].  S is the rank-2 recurrence state, coeffs take (t, d, e), and the readout
// reduction over d stays a loop inside emit (not a scan of its own).

func.func @retnet(%q: memref<6x4xf32>, %k: memref<6x4xf32>, %v: memref<6x3xf32>, %S: memref<4x3xf32>, %out: memref<6x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %c6 = arith.constant 6 : index
  %gamma = arith.constant 0.9 : f32
  %zero = arith.constant 0.0 : f32
  scf.for %t = %c0 to %c6 step %c1 {
    scf.for %d = %c0 to %c4 step %c1 {
      %kd = memref.load %k[%t, %d] : memref<6x4xf32>
      scf.for %e = %c0 to %c3 step %c1 {
        %s = memref.load %S[%d, %e] : memref<4x3xf32>
        %ve = memref.load %v[%t, %e] : memref<6x3xf32>
        %kv = arith.mulf %kd, %ve : f32
        %gs = arith.mulf %gamma, %s : f32
        %sn = arith.addf %gs, %kv : f32
        memref.store %sn, %S[%d, %e] : memref<4x3xf32>
      }
    }
    scf.for %e = %c0 to %c3 step %c1 {
      %acc = scf.for %d = %c0 to %c4 step %c1 iter_args(%a = %zero) -> (f32) {
        %qd = memref.load %q[%t, %d] : memref<6x4xf32>
        %s = memref.load %S[%d, %e] : memref<4x3xf32>
        %p = arith.mulf %qd, %s : f32
        %an = arith.addf %a, %p : f32
        scf.yield %an : f32
      }
      memref.store %acc, %out[%t, %e] : memref<6x3xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @retnet
// CHECK:         scan.recurrence %c0 to %c6 step %c1 state(%S : memref<4x3xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index, %[[D:.*]]: index, %[[E:.*]]: index):
// CHECK-NEXT:      %[[KD:.*]] = memref.load %k[%[[T]], %[[D]]] : memref<6x4xf32>
// CHECK-NEXT:      %[[VE:.*]] = memref.load %v[%[[T]], %[[E]]] : memref<6x3xf32>
// CHECK-NEXT:      %[[KV:.*]] = arith.mulf %[[KD]], %[[VE]] : f32
// CHECK-NEXT:      scan.yield %gamma, %[[KV]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<4x3xf32>):
// CHECK-NEXT:      scf.for %[[E2:.*]] = %c0 to %c3 step %c1 {
// CHECK-NEXT:        %{{.*}} = scf.for %[[D2:.*]] = %c0 to %c4 step %c1 iter_args(%{{.*}} = %zero) -> (f32) {
// CHECK:               memref.load %[[ST]][%[[D2]], %[[E2]]] : memref<4x3xf32>
// CHECK:             memref.store %{{.*}}, %out[%[[T2]], %[[E2]]] : memref<6x3xf32>
// CHECK-NOT:     scan.recurrence
