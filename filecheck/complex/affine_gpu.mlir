// RUN: xdsl-opt %s -p scan-complex-affine-to-recurrence | filecheck %s
// RUN: xdsl-opt %s -p scan-complex-affine-to-recurrence,scan-complex-to-pairs,scan-to-gpu,scan-complex-to-real | filecheck %s --check-prefix=GPU
// A complex scan.affine becomes one rank-0 complex scan.recurrence per channel (the GPU's
// fused (re, im) kernel then takes it); reverse reads and writes step i at (L - 1) - i.

func.func @rev(%a: memref<?x?xcomplex<f32>>, %b: memref<?x?xcomplex<f32>>, %h0: memref<?xcomplex<f32>>, %h: memref<?x?xcomplex<f32>>, %hT: memref<?xcomplex<f32>>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<?x?xcomplex<f32>>, memref<?x?xcomplex<f32>>, memref<?xcomplex<f32>> -> memref<?x?xcomplex<f32>>, memref<?xcomplex<f32>>
  func.return
}
// CHECK-LABEL: func.func @rev
// CHECK:         %[[L:.*]] = memref.dim %h, %{{.*}} : memref<?x?xcomplex<f32>>
// CHECK:         %[[LAST:.*]] = arith.subi %[[L]], %{{.*}} : index
// CHECK:         %[[C:.*]] = memref.dim %h, %{{.*}} : memref<?x?xcomplex<f32>>
// CHECK:         scf.for %[[CH:.*]] = %{{.*}} to %[[C]] step %{{.*}} {
// CHECK-NEXT:      %[[S:.*]] = memref.alloca() : memref<complex<f32>>
// CHECK-NEXT:      %[[I:.*]] = memref.load %h0[%[[CH]]] : memref<?xcomplex<f32>>
// CHECK-NEXT:      memref.store %[[I]], %[[S]][] : memref<complex<f32>>
// CHECK-NEXT:      scan.recurrence %{{.*}} to %[[L]] step %{{.*}} state(%[[S]] : memref<complex<f32>>) coeffs {
// CHECK-NEXT:      ^{{.*}}(%[[K:.*]]: index):
// CHECK-NEXT:        %[[T:.*]] = arith.subi %[[LAST]], %[[K]] : index
// CHECK-NEXT:        %[[A:.*]] = memref.load %a[%[[CH]], %[[T]]] : memref<?x?xcomplex<f32>>
// CHECK-NEXT:        %[[B:.*]] = memref.load %b[%[[CH]], %[[T]]] : memref<?x?xcomplex<f32>>
// CHECK-NEXT:        scan.yield %[[A]], %[[B]] : complex<f32>, complex<f32>
// CHECK-NEXT:      } emit {
// CHECK-NEXT:      ^{{.*}}(%[[E:.*]]: index, %[[ST:.*]]: memref<complex<f32>>):
// CHECK-NEXT:        %[[V:.*]] = memref.load %[[ST]][] : memref<complex<f32>>
// CHECK-NEXT:        %[[TE:.*]] = arith.subi %[[LAST]], %[[E]] : index
// CHECK-NEXT:        memref.store %[[V]], %h[%[[CH]], %[[TE]]] : memref<?x?xcomplex<f32>>
// CHECK-NEXT:        scan.yield
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[F:.*]] = memref.load %[[S]][] : memref<complex<f32>>
// CHECK-NEXT:      memref.store %[[F]], %hT[%[[CH]]] : memref<?xcomplex<f32>>
// CHECK-NEXT:    }
// CHECK-NOT:     scan.affine

// GPU-LABEL: func.func @rev
// GPU:         "gpu.launch_func"({{.*}}, %a, %b, %h0, %h, %hT) <{kernel = @scanweaver_kernels::@scan_linear_0
// GPU-LABEL: func.func @fwd
// GPU:         "gpu.launch_func"({{.*}}, %a, %b, %h) <{kernel = @scanweaver_kernels::@scan_linear_1
//              the kernel reads complex memory (interleaved pairs) and computes on (re, im)
// GPU:         "gpu.func"() <{function_type = (memref<?x?xcomplex<f32>>, memref<?x?xcomplex<f32>>, memref<?xcomplex<f32>>, memref<?x?xcomplex<f32>>, memref<?xcomplex<f32>>) -> (), kernel}>
// GPU-NOT:       complex.mul
// GPU:           memref.load %{{.*}} : memref<?x?xcomplex<f32>>
// GPU:           complex.re %{{.*}} : complex<f32>
// GPU-NOT:       complex.mul
// GPU:         "gpu.func"() <{function_type = (memref<9xcomplex<f64>>, memref<9xcomplex<f64>>, memref<9xcomplex<f64>>) -> (), kernel}>

// Forward without init or final, rank 1 (one sequence: a one-trip channel loop), f64.
func.func @fwd(%a: memref<9xcomplex<f64>>, %b: memref<9xcomplex<f64>>, %h: memref<9xcomplex<f64>>) {
  scan.affine %a, %b into %h axis 0 : memref<9xcomplex<f64>>, memref<9xcomplex<f64>> -> memref<9xcomplex<f64>>
  func.return
}
// CHECK-LABEL: func.func @fwd
// CHECK:         scf.for %[[CH:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[S:.*]] = memref.alloca() : memref<complex<f64>>
// CHECK-NEXT:      %[[Z:.*]] = complex.constant [0.000000e+00 : f64, 0.000000e+00 : f64] : complex<f64>
// CHECK-NEXT:      memref.store %[[Z]], %[[S]][] : memref<complex<f64>>
// CHECK-NEXT:      scan.recurrence
// CHECK-NEXT:      ^{{.*}}(%[[K:.*]]: index):
// CHECK-NEXT:        %[[A:.*]] = memref.load %a[%[[K]]] : memref<9xcomplex<f64>>
// CHECK-NEXT:        %[[B:.*]] = memref.load %b[%[[K]]] : memref<9xcomplex<f64>>
// CHECK-NEXT:        scan.yield %[[A]], %[[B]] : complex<f64>, complex<f64>
// CHECK:             memref.store %{{.*}}, %h[%{{.*}}] : memref<9xcomplex<f64>>
// CHECK:           }
// CHECK-NOT:       memref.store
// CHECK:         func.return
