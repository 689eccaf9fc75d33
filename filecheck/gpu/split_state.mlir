// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=4 items-per-thread=2}' | filecheck %s
// A state of dynamic shape (a dynamic channel count, memref<?xf32>) whose emit reads it
// element by element is split into one channel per element (gpu_split_state.py): one
// block per element of %h, a rank-0 private state per thread, %h read and written back
// by the kernel.

func.func @ema(%x: memref<?x?xf32>, %a: memref<?xf32>, %h: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nt = memref.dim %x, %c0 : memref<?x?xf32>
  %nc = memref.dim %h, %c0 : memref<?xf32>
  scan.recurrence %c0 to %nt step %c1 state(%h : memref<?xf32>) coeffs {
  ^bb0(%t: index, %c: index):
    %av = memref.load %a[%c] : memref<?xf32>
    %xv = memref.load %x[%t, %c] : memref<?x?xf32>
    scan.yield %av, %xv : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<?xf32>):
    scf.for %c = %c0 to %nc step %c1 {
      %v = memref.load %s[%c] : memref<?xf32>
      memref.store %v, %y[%t, %c] : memref<?x?xf32>
    }
    scan.yield
  }
  func.return
}

// CHECK:      func.func @ema(
// CHECK:        %[[D:[0-9]+]] = memref.dim %h, %{{.*}} : memref<?xf32>
// CHECK-NEXT:   %[[ANY:[0-9]+]] = arith.cmpi sgt, %[[D]], %{{.*}} : index
// CHECK-NEXT:   %{{[0-9]+}} = arith.constant 1 : index
// CHECK-NEXT:   %{{[0-9]+}} = arith.constant 4 : index
// CHECK-NEXT:   scf.if %[[ANY]] {
// CHECK-NEXT:   "gpu.launch_func"(%[[D]], {{.*}}, %x, %a, %h, %y)
// CHECK-SAME:     @scanweaver_kernels::@scan_recurrence_0
// CHECK-NOT:    scan.recurrence
// CHECK:        func.return
// CHECK:      "gpu.func"()
// CHECK:        memref.alloca() : memref<f32>
// CHECK:        sym_name = "scan_recurrence_0"
// CHECK-SAME:   grid = ["h.shape[0]", 1 : i64, 1 : i64]
// CHECK-SAME:   ["h", "inout", "f32", ["?"]]
// CHECK-SAME:   state scalar f32
// CHECK-SAME:   covers_dims = [["a", 0 : i64, "h", 0 : i64], ["x", 1 : i64, "h", 0 : i64], ["y", 0 : i64, "x", 0 : i64], ["y", 1 : i64, "h", 0 : i64]]
