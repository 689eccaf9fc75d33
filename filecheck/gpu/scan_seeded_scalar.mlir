// RUN: xdsl-opt %s -p scanweaver-raise,gpu-results-to-args,scan-to-gpu | filecheck %s
// A running max of x[t] * scale, with %scale a scalar function argument: the seeded
// scan kernel (scan_seed_gpu.py) takes %scale as a kernel parameter and clones the
// producer's multiply into its load; no host loop and no temporary is left.

func.func @run(%x: memref<?xf32>, %y: memref<?xf32>, %h0: f32, %scale: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %t = %c0 to %n step %c1 iter_args(%h = %h0) -> (f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %xs = arith.mulf %xv, %scale : f32
    %hn = arith.maximumf %h, %xs : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK:       func.func @run(%x: memref<?xf32>, %y: memref<?xf32>, %h0: f32, %scale: f32, %result0: memref<f32>)
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     scf.for
// CHECK:         "gpu.launch_func"({{.*}}, %x, %y, %h0, %result0, %scale) <{kernel = @scanweaver_kernels::@scan_generic_0
// CHECK-NEXT:    func.return
// CHECK:       ^bb0(%x0: memref<?xf32>, %y0: memref<?xf32>, %init0: f32, %final0: memref<f32>, %p0: f32):
// CHECK:         %[[X:.*]] = memref.load %x0[%{{.*}}] : memref<?xf32>
// CHECK-NEXT:    %{{.*}} = arith.mulf %[[X]], %p0 : f32
