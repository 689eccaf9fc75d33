// RUN: xdsl-opt %s -p scanweaver-raise,scan-to-gpu{block-size=64} | filecheck %s
// Dynamic RetNet: a D x E state of dynamic size whose emit sums q[t, d] * S[d, e] over d.
// The state matrix kernel (gpu_state_matrix.py): one block per column e (the launch
// skipped for no columns), threads over rows d in chunks of 64, each holding S[d, e] in
// a register; 32-step time chunks, the terms staged in shared memory (rows padded to
// 65), two barriers per chunk; out[t, e] = init + sum, or += for later row chunks.

func.func @retnet(%q: memref<?x?xf32>, %k: memref<?x?xf32>, %v: memref<?x?xf32>, %g: memref<?xf32>, %S: memref<?x?xf32>, %out: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %T = memref.dim %q, %c0 : memref<?x?xf32>
  %D = memref.dim %S, %c0 : memref<?x?xf32>
  %E = memref.dim %S, %c1 : memref<?x?xf32>
  %zero = arith.constant 0.0 : f32
  scf.for %t = %c0 to %T step %c1 {
    %gamma = memref.load %g[%t] : memref<?xf32>
    scf.for %d = %c0 to %D step %c1 {
      %kd = memref.load %k[%t, %d] : memref<?x?xf32>
      scf.for %e = %c0 to %E step %c1 {
        %s = memref.load %S[%d, %e] : memref<?x?xf32>
        %ve = memref.load %v[%t, %e] : memref<?x?xf32>
        %kv = arith.mulf %kd, %ve : f32
        %gs = arith.mulf %gamma, %s : f32
        %sn = arith.addf %gs, %kv : f32
        memref.store %sn, %S[%d, %e] : memref<?x?xf32>
      }
    }
    scf.for %e = %c0 to %E step %c1 {
      %acc = scf.for %d = %c0 to %D step %c1 iter_args(%a = %zero) -> (f32) {
        %qd = memref.load %q[%t, %d] : memref<?x?xf32>
        %s = memref.load %S[%d, %e] : memref<?x?xf32>
        %p = arith.mulf %qd, %s : f32
        %an = arith.addf %a, %p : f32
        scf.yield %an : f32
      }
      memref.store %acc, %out[%t, %e] : memref<?x?xf32>
    }
  }
  func.return
}


// CHECK:       func.func @retnet(
// CHECK-NOT:     scan.recurrence
// CHECK:         %[[E:[0-9]+]] = memref.dim %S, %{{.*}} : memref<?x?xf32>
// CHECK:         %[[ANY:.*]] = arith.cmpi sgt, %[[E]], %{{.*}} : index
// CHECK-NEXT:    %{{[0-9]+}} = arith.constant 64 : index
// CHECK-NEXT:    scf.if %[[ANY]] {
// CHECK-NEXT:      "gpu.launch_func"(%[[E]], {{.*}}, %q, %k, %v, %g, %S, %out) <{kernel = @scanweaver_kernels::@state_matrix_0
// CHECK:       "memref.global"() <{sym_name = "state_matrix_0_p", type = memref<2080xf32, 3 : i64>
// CHECK:       "memref.global"() <{sym_name = "state_matrix_0_q", type = memref<64xf32, 3 : i64>
// the row chunks, then this thread's state element
// CHECK:         scf.for
// CHECK:           memref.load %S[
// the time chunks: the update a * h + b and the term, guarded (row and step in range)
// CHECK:           scf.for
// CHECK:             scf.for
// CHECK:               scf.if %{{.*}} -> (f32, f32) {
// CHECK:                 %[[A:.*]] = arith.mulf %gamma, %{{.*}} : f32
// CHECK-NEXT:            %[[H:.*]] = arith.addf %[[A]], %kv : f32
// CHECK:                 %p = arith.mulf %qd, %[[H]] : f32
// CHECK:               } else {
// CHECK-NEXT:            scf.yield %{{.*}}, %{{.*}} : f32, f32
// CHECK:               memref.store %{{.*}}, %{{.*}}[%{{.*}}] : memref<2080xf32, 3 : i64>
// CHECK:             "gpu.barrier"() : () -> ()
// CHECK:             memref.store %{{.*}}, %{{.*}}[%{{.*}}] : memref<64xf32, 3 : i64>
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NOT:         "gpu.barrier"
// CHECK:             memref.load %out[
// CHECK:             memref.store %{{.*}}, %out[
// the final state, once per thread
// CHECK:           memref.store %{{.*}}, %S[
// CHECK:       grid = ["S.shape[1]", 1 : i64, 1 : i64], block = [64 : i64, 1 : i64, 1 : i64]
