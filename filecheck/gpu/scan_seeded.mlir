// RUN: xdsl-opt %s -p scanweaver-raise,gpu-results-to-args,scan-to-gpu | filecheck %s
// A running max raises to a scan.scan between host copies into and out of temporaries
// (raise_assoc.py); for the GPU the group folds into one kernel over %x into %y seeded
// with %h0 (a scalar kernel parameter), which also writes the last value (the seed when
// the length is 0) to result0: no host loop and no temporary is left.

func.func @run(%x: memref<?xf32>, %y: memref<?xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %t = %c0 to %n step %c1 iter_args(%h = %h0) -> (f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %hn = arith.maximumf %h, %xv : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK:       func.func @run(%x: memref<?xf32>, %y: memref<?xf32>, %h0: f32, %result0: memref<f32>)
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     scf.for
// CHECK:         "gpu.launch_func"({{.*}}, %x, %y, %h0, %result0) <{kernel = @scanweaver_kernels::@scan_generic_0
// CHECK-NEXT:    func.return
// CHECK:       ^bb0(%x0: memref<?xf32>, %y0: memref<?xf32>, %init0: f32, %final0: memref<f32>):
// the seed is the carry before the first tile, and the result when the length is 0
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      memref.store %init0, %{{.*}}[%{{.*}}] : memref<1xf32, 3 : i64>
// CHECK-NEXT:      %[[EMPTY:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
// CHECK-NEXT:      scf.if %[[EMPTY]] {
// CHECK-NEXT:        memref.store %init0, %final0[] : memref<f32>
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    "gpu.barrier"() : () -> ()
// CHECK:         arith.maximumf
// final: the thread of step L - 1 stores its inclusive value
// CHECK:             memref.store %[[V:.*]], %y0[%[[T:.*]]] : memref<?xf32>
// CHECK-NEXT:        %[[LAST:.*]] = arith.cmpi eq, %[[T]], %{{.*}} : index
// CHECK-NEXT:        scf.if %[[LAST]] {
// CHECK-NEXT:          memref.store %[[V]], %final0[] : memref<f32>
// CHECK-NEXT:        }
// CHECK:       scanweaver.launch = {{.*}}args = {{\[}}["x0", "in", "f32", ["?"]], ["y0", "out", "f32", ["?"]], ["init0", "scalar", "f32", []], ["final0", "out", "f32", []]]
