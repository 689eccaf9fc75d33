// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// A complex state carried as the time loop's iter_arg (lru_iter_arg_loops(2, 5)):
// h = lam*h + b[c, t] through complex.mul and complex.add raises to a scan.recurrence
// over a rank-0 complex state; the zero initial value is copied in.

// CHECK-LABEL: func.func @lru_iter
// CHECK:         %[[LAM:.*]] = memref.load %lam[%c] : memref<2xcomplex<f32>>
// CHECK:         %[[Z:.*]] = complex.constant [0.000000e+00 : f32, 0.000000e+00 : f32] : complex<f32>
// CHECK:         %[[S:.*]] = memref.alloca() : memref<complex<f32>>
// CHECK-NEXT:    memref.store %[[Z]], %[[S]][] : memref<complex<f32>>
// CHECK-NEXT:    scan.recurrence %{{.*}} state(%[[S]] : memref<complex<f32>>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:      %[[B:.*]] = memref.load %b[%c, %[[T]]] : memref<2x5xcomplex<f32>>
// CHECK-NEXT:      scan.yield %[[LAM]], %[[B]] : complex<f32>, complex<f32>
// CHECK-NEXT:    } emit {
// CHECK:           memref.store %{{.*}}, %h[%c, %{{.*}}] : memref<2x5xcomplex<f32>>
// CHECK:         %[[LAST:.*]] = memref.load %[[S]][] : memref<complex<f32>>
// CHECK-NEXT:    memref.store %[[LAST]], %hT[%c] : memref<2xcomplex<f32>>
// CHECK-NOT:     complex.mul

builtin.module {
  func.func @lru_iter(%lam: memref<2xcomplex<f32>>, %b: memref<2x5xcomplex<f32>>, %h: memref<2x5xcomplex<f32>>, %hT: memref<2xcomplex<f32>>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 2 : index
    %2 = arith.constant 1 : index
    scf.for %c = %0 to %1 step %2 {
      %3 = memref.load %lam[%c] : memref<2xcomplex<f32>>
      %4 = complex.constant [0.000000e+00 : f32, 0.000000e+00 : f32] : complex<f32>
      %5 = arith.constant 0 : index
      %6 = arith.constant 5 : index
      %7 = arith.constant 1 : index
      %8 = scf.for %t = %5 to %6 step %7 iter_args(%9 = %4) -> (complex<f32>) {
        %10 = complex.mul %3, %9 : complex<f32>
        %11 = memref.load %b[%c, %t] : memref<2x5xcomplex<f32>>
        %12 = complex.add %10, %11 : complex<f32>
        memref.store %12, %h[%c, %t] : memref<2x5xcomplex<f32>>
        scf.yield %12 : complex<f32>
      }
      memref.store %8, %hT[%c] : memref<2xcomplex<f32>>
    }
    func.return
  }
}

