// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// The Linear Recurrent Unit as printed by scanweaver.workloads.lru.lru_loops(4, 3, 2):
// h[n] = lam[n]*h[n] + gamma[n]*Bu[t, n] (complex state in memref<3xcomplex<f32>>),
// y[t, k] = sum_n Re(C[k, n]*h[n]) + D[k]*x[t, k].  The time loop becomes one
// scan.recurrence: gamma*Bu is the producer (coeffs), Re(C h) + D x the consumer (emit).

// CHECK-LABEL: func.func @lru
// CHECK-NOT:     scf.for %t
// CHECK:         scan.recurrence %{{.*}} to %{{.*}} step %{{.*}} state(%h : memref<3xcomplex<f32>>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index, %[[N:.*]]: index):
// CHECK-NEXT:      %[[LAM:.*]] = memref.load %lam[%[[N]]] : memref<3xcomplex<f32>>
// CHECK-NEXT:      %[[BU:.*]] = memref.load %Bu[%[[T]], %[[N]]] : memref<4x3xcomplex<f32>>
// CHECK:           %[[B:.*]] = complex.create %{{.*}}, %{{.*}} : complex<f32>
// CHECK-NEXT:      scan.yield %[[LAM]], %[[B]] : complex<f32>, complex<f32>
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[S:.*]]: memref<3xcomplex<f32>>):
// CHECK:           scf.for %k
// CHECK:             %[[HN:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xcomplex<f32>>
// CHECK-NEXT:        %[[CH:.*]] = complex.mul %{{.*}}, %[[HN]] : complex<f32>
// CHECK-NEXT:        %[[RE:.*]] = complex.re %[[CH]] : complex<f32>
// CHECK-NEXT:        arith.addf %{{.*}}, %[[RE]] : f32
// CHECK:           memref.store %{{.*}}, %y[%[[T2]], %k] : memref<4x2xf32>
// CHECK:           scan.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

builtin.module {
  func.func @lru(%lam: memref<3xcomplex<f32>>, %gamma: memref<3xf32>, %Bu: memref<4x3xcomplex<f32>>, %C: memref<2x3xcomplex<f32>>, %D: memref<2xf32>, %x: memref<4x2xf32>, %h: memref<3xcomplex<f32>>, %y: memref<4x2xf32>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 4 : index
    %2 = arith.constant 1 : index
    scf.for %t = %0 to %1 step %2 {
      %3 = arith.constant 0 : index
      %4 = arith.constant 3 : index
      %5 = arith.constant 1 : index
      scf.for %n = %3 to %4 step %5 {
        %6 = memref.load %gamma[%n] : memref<3xf32>
        %7 = memref.load %Bu[%t, %n] : memref<4x3xcomplex<f32>>
        %8 = complex.re %7 : complex<f32>
        %9 = arith.mulf %8, %6 : f32
        %10 = complex.im %7 : complex<f32>
        %11 = arith.mulf %10, %6 : f32
        %12 = complex.create %9, %11 : complex<f32>
        %13 = memref.load %lam[%n] : memref<3xcomplex<f32>>
        %14 = memref.load %h[%n] : memref<3xcomplex<f32>>
        %15 = complex.mul %13, %14 : complex<f32>
        %16 = complex.add %15, %12 : complex<f32>
        memref.store %16, %h[%n] : memref<3xcomplex<f32>>
      }
      %17 = arith.constant 0 : index
      %18 = arith.constant 2 : index
      %19 = arith.constant 1 : index
      scf.for %k = %17 to %18 step %19 {
        %20 = arith.constant 0.000000e+00 : f32
        %21 = arith.constant 0 : index
        %22 = arith.constant 3 : index
        %23 = arith.constant 1 : index
        %24 = scf.for %n_1 = %21 to %22 step %23 iter_args(%25 = %20) -> (f32) {
          %26 = memref.load %C[%k, %n_1] : memref<2x3xcomplex<f32>>
          %27 = memref.load %h[%n_1] : memref<3xcomplex<f32>>
          %28 = complex.mul %26, %27 : complex<f32>
          %29 = complex.re %28 : complex<f32>
          %30 = arith.addf %25, %29 : f32
          scf.yield %30 : f32
        }
        %31 = memref.load %D[%k] : memref<2xf32>
        %32 = memref.load %x[%t, %k] : memref<4x2xf32>
        %33 = arith.mulf %31, %32 : f32
        %34 = arith.addf %24, %33 : f32
        memref.store %34, %y[%t, %k] : memref<4x2xf32>
      }
    }
    func.return
  }
}

