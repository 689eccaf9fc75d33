// RUN: xdsl-opt %s -p scanweaver-raise,gpu-results-to-args,scan-to-gpu | filecheck %s
// A running max of state kept per channel in memory, written time-outer
// (`for t { for c }` over x[t, c]): the promote reshape moves the channel loop outside
// and the associative raise puts a scan.scan between host copies inside it.  For the GPU
// the whole channel loop becomes the grid of ONE seeded kernel (scan_seed_gpu.py):
// block c loads its seed m[c] (under the reshape's guard 0 < n, and in bounds), scans
// x[:, c] and the thread of the last step stores m[c]; the launch (guarded by C > 0)
// replaces the loop and checks that x covers the channel count.

func.func @mc(%x: memref<?x?xi32>, %m: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nc = memref.dim %m, %c0 : memref<?xi32>
  %n = memref.dim %x, %c0 : memref<?x?xi32>
  scf.for %t = %c0 to %n step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      %xv = memref.load %x[%t, %c] : memref<?x?xi32>
      %old = memref.load %m[%c] : memref<?xi32>
      %new = arith.maxsi %old, %xv : i32
      memref.store %new, %m[%c] : memref<?xi32>
    }
  }
  func.return
}

// CHECK:       func.func @mc(%x: memref<?x?xi32>, %m: memref<?xi32>)
// CHECK-NOT:     scf.for
// CHECK-NOT:     memref.alloc
// CHECK:         %[[C:[0-9]+]] = memref.dim %m, %{{.*}} : memref<?xi32>
// CHECK:         %[[ANY:.*]] = arith.cmpi sgt, %[[C]], %{{.*}} : index
// CHECK:         scf.if %[[ANY]] {
// CHECK-NEXT:      "gpu.launch_func"(%[[C]], {{.*}}, %x, %m) <{kernel = @scanweaver_kernels::@scan_generic_0
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
// CHECK:       ^bb0(%x0: memref<?x?xi32>, %init0: memref<?xi32>):
// the block id is the channel: the seed m[c], guarded (0 < n, c in bounds)
// CHECK:         %[[B:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:         scf.if %{{.*}} -> (i32) {
// CHECK-NEXT:      memref.load %init0[%[[B]]] : memref<?xi32>
// the producer's load x[t, c]
// CHECK:         memref.load %x0[%{{.*}}, %[[B]]] : memref<?x?xi32>
// CHECK:         arith.maxsi
// the final store m[c], by the thread of the last step
// CHECK:         memref.store %{{.*}}, %init0[%[[B]]] : memref<?xi32>
// CHECK:       scanweaver.launch = {{.*}}grid = ["init0.shape[0]", 1 : i64, 1 : i64]{{.*}}args = {{\[}}["x0", "in", "i32", ["?", "?"]], ["init0", "inout", "i32", ["?"]]]
// CHECK-SAME:    covers_dims = {{\[}}["x0", 1 : i64, "init0", 0 : i64]]
