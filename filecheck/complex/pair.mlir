// RUN: xdsl-opt %s -p scanweaver-raise,scan-pairs-to-complex | filecheck %s

// The same recurrence by hand on a (re, im) pair of f32 iter_args
// (lru_pair_loops(2, 5)): hr' = (lr*hr - li*hi) + br, hi' = (lr*hi + li*hr) + bi.
// The coupled 2x2 update [[lr, -li], [li, lr]] is multiplication by lr + li*i: it
// raises to a diagonal complex scan.recurrence (a = lr + li*i, b = br + bi*i), the
// pair memref<2xf32> kept as the program's view of the state.

// CHECK-LABEL: func.func @lru_pair
// CHECK-NOT:     scan.linear_recurrence
// CHECK:         %[[LR:.*]] = memref.load %lr[%c] : memref<2xf32>
// CHECK-NEXT:    %[[LI:.*]] = memref.load %li[%c] : memref<2xf32>
// CHECK:         %[[PAIR:.*]] = memref.alloca() : memref<2xf32>
// CHECK:         %[[S:.*]] = memref.alloca() : memref<complex<f32>>
// CHECK:         %[[H0:.*]] = complex.create %{{.*}}, %{{.*}} : complex<f32>
// CHECK-NEXT:    memref.store %[[H0]], %[[S]][] : memref<complex<f32>>
// CHECK-NEXT:    scan.recurrence %{{.*}} state(%[[S]] : memref<complex<f32>>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index):
// CHECK:           %[[BR:.*]] = memref.load %br[%c, %[[T]]] : memref<2x5xf32>
// CHECK-NEXT:      %[[BI:.*]] = memref.load %bi[%c, %[[T]]] : memref<2x5xf32>
// CHECK-NEXT:      %[[A:.*]] = complex.create %[[LR]], %[[LI]] : complex<f32>
// CHECK-NEXT:      %[[B:.*]] = complex.create %[[BR]], %[[BI]] : complex<f32>
// CHECK-NEXT:      scan.yield %[[A]], %[[B]] : complex<f32>, complex<f32>
// CHECK-NEXT:    } emit {
// CHECK:           complex.re
// CHECK:           memref.store %{{.*}}, %[[PAIR]][%{{.*}}] : memref<2xf32>
// CHECK:           complex.im
// CHECK:           memref.store %{{.*}}, %[[PAIR]][%{{.*}}] : memref<2xf32>
// CHECK:           memref.store %{{.*}}, %yr[%c, %{{.*}}] : memref<2x5xf32>
// CHECK-NEXT:      memref.store %{{.*}}, %yi[%c, %{{.*}}] : memref<2x5xf32>

builtin.module {
  func.func @lru_pair(%lr: memref<2xf32>, %li: memref<2xf32>, %br: memref<2x5xf32>, %bi: memref<2x5xf32>, %yr: memref<2x5xf32>, %yi: memref<2x5xf32>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 2 : index
    %2 = arith.constant 1 : index
    scf.for %c = %0 to %1 step %2 {
      %3 = memref.load %lr[%c] : memref<2xf32>
      %4 = memref.load %li[%c] : memref<2xf32>
      %5 = arith.constant 0.000000e+00 : f32
      %6 = arith.constant 0 : index
      %7 = arith.constant 5 : index
      %8 = arith.constant 1 : index
      %9, %10 = scf.for %t = %6 to %7 step %8 iter_args(%11 = %5, %12 = %5) -> (f32, f32) {
        %13 = arith.mulf %3, %11 : f32
        %14 = arith.mulf %4, %12 : f32
        %15 = arith.subf %13, %14 : f32
        %16 = memref.load %br[%c, %t] : memref<2x5xf32>
        %17 = arith.addf %15, %16 : f32
        %18 = arith.mulf %3, %12 : f32
        %19 = arith.mulf %4, %11 : f32
        %20 = arith.addf %18, %19 : f32
        %21 = memref.load %bi[%c, %t] : memref<2x5xf32>
        %22 = arith.addf %20, %21 : f32
        memref.store %17, %yr[%c, %t] : memref<2x5xf32>
        memref.store %22, %yi[%c, %t] : memref<2x5xf32>
        scf.yield %17, %22 : f32, f32
      }
    }
    func.return
  }
}

