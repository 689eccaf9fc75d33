// RUN: xdsl-opt %s -p 'scanweaver-raise{reassociate=true},gpu-results-to-args,scan-to-gpu' | filecheck %s
// The online log-sum-exp (m, s) raises (with reassociate=true) to a 2-operand scan.scan
// whose producer computes the pair (x[t], 1.0) and which has no output array: for the
// GPU the group folds into one seeded kernel that loads x[t], makes the pair itself, and
// writes only the two results. No host loop and no temporary is left.

func.func @lse(%x: memref<?xf32>, %m0: f32, %s0: f32) -> (f32, f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r:2 = scf.for %t = %c0 to %n step %c1 iter_args(%m = %m0, %s = %s0) -> (f32, f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %mn = arith.maximumf %m, %xv : f32
    %d1 = arith.subf %m, %mn : f32
    %e1 = math.exp %d1 : f32
    %sc = arith.mulf %s, %e1 : f32
    %d2 = arith.subf %xv, %mn : f32
    %e2 = math.exp %d2 : f32
    %sn = arith.addf %sc, %e2 : f32
    scf.yield %mn, %sn : f32, f32
  }
  func.return %r#0, %r#1 : f32, f32
}

// CHECK:       func.func @lse(%x: memref<?xf32>, %m0: f32, %s0: f32, %result0: memref<f32>, %result1: memref<f32>)
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     scf.for
// CHECK:         "gpu.launch_func"({{.*}}, %x, %m0, %s0, %result0, %result1) <{kernel = @scanweaver_kernels::@scan_generic_0
// CHECK-NEXT:    func.return
// CHECK:       ^bb0(%x0: memref<?xf32>, %init0: f32, %init1: f32, %final0: memref<f32>, %final1: memref<f32>):
// the producer's map, cloned into the guarded load: (x[t], 1.0)
// CHECK:         scf.if %{{.*}} -> (f32, f32) {
// CHECK:           %[[XV:.*]] = memref.load %x0[%{{.*}}] : memref<?xf32>
// CHECK:           %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      scf.yield %[[XV]], %[[ONE]] : f32, f32
// CHECK:         math.exp
// CHECK:         memref.store %{{.*}}, %final0[] : memref<f32>
// CHECK-NEXT:    memref.store %{{.*}}, %final1[] : memref<f32>
// CHECK-NOT:     memref.store %{{.*}}, %x0
// CHECK:       scanweaver.launch = {{.*}}args = {{\[}}["x0", "in", "f32", ["?"]], ["init0", "scalar", "f32", []], ["init1", "scalar", "f32", []], ["final0", "out", "f32", []], ["final1", "out", "f32", []]]
