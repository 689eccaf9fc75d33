// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Mamba selective scan (grouped B/C, G=2, no z), as printed by
// scanweaver.workloads.loops.selective_scan_loops(1, 2, 4, 3, bc="grouped", groups=2,
// with_z=False).  The time loop becomes one scan.recurrence over h (memref<3xf32>, the
// channel shape, so h itself is the state): exp(dt*A) and dt*u*B are the producer in
// coeffs(t, n); the reduction y = sum_n h[n]*C[n] and the output go to emit.

// CHECK:       %h = memref.alloca() : memref<3xf32>
// CHECK:       scf.for %n = {{.*}} {
// CHECK-NEXT:    memref.store %{{.*}}, %h[%n] : memref<3xf32>
// CHECK-NEXT:  }
// CHECK-NOT:   scf.for
// CHECK:       scan.recurrence %{{.*}} to %{{.*}} step %{{.*}} state(%h : memref<3xf32>) coeffs {
// CHECK-NEXT:  ^{{.*}}(%[[T:.*]]: index, %[[N:.*]]: index):
// CHECK-NEXT:    %[[DL:.*]] = memref.load %delta[%b, %d, %[[T]]] : memref<1x2x4xf32>
// CHECK:         %[[SP:.*]] = math.log1p
// CHECK-NEXT:    %[[DT:.*]] = arith.select %{{.*}}, %{{.*}}, %[[SP]] : f32
// CHECK-NEXT:    %[[AV:.*]] = memref.load %A[%d, %[[N]]] : memref<2x3xf32>
// CHECK-NEXT:    %[[DA:.*]] = arith.mulf %[[DT]], %[[AV]] : f32
// CHECK-NEXT:    %[[DECAY:.*]] = math.exp %[[DA]] : f32
// CHECK:         %[[BV:.*]] = memref.load %B[%b, %{{.*}}, %[[N]], %[[T]]] : memref<1x2x3x4xf32>
// CHECK-NEXT:    %[[DRIVE:.*]] = arith.mulf %{{.*}}, %[[BV]] : f32
// CHECK-NEXT:    scan.yield %[[DECAY]], %[[DRIVE]] : f32, f32
// CHECK-NEXT:  } emit {
// CHECK-NEXT:  ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<3xf32>):
// CHECK-NOT:     math.exp
// CHECK:         %[[Y:.*]] = scf.for %[[N2:.*]] = {{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (f32) {
// CHECK-NEXT:      %[[HN:.*]] = memref.load %[[ST]][%[[N2]]] : memref<3xf32>
// CHECK:           %[[CV:.*]] = memref.load %C[%b, %{{.*}}, %[[N2]], %[[T2]]] : memref<1x2x3x4xf32>
// CHECK-NEXT:      %[[HC:.*]] = arith.mulf %[[HN]], %[[CV]] : f32
// CHECK-NEXT:      %[[ACC2:.*]] = arith.addf %[[ACC]], %[[HC]] : f32
// CHECK-NEXT:      scf.yield %[[ACC2]] : f32
// CHECK-NEXT:    }
// CHECK:         memref.store %{{.*}}, %out[%b, %d, %[[T2]]] : memref<1x2x4xf32>
// CHECK-NEXT:    scan.yield
// CHECK-NEXT:  }

builtin.module {
  func.func @selective_scan(%u: memref<1x2x4xf32>, %delta: memref<1x2x4xf32>, %A: memref<2x3xf32>, %B: memref<1x2x3x4xf32>, %C: memref<1x2x3x4xf32>, %D_skip: memref<2xf32>, %delta_bias: memref<2xf32>, %out: memref<1x2x4xf32>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 1 : index
    %2 = arith.constant 1 : index
    scf.for %b = %0 to %1 step %2 {
      %3 = arith.constant 0 : index
      %4 = arith.constant 2 : index
      %5 = arith.constant 1 : index
      scf.for %d = %3 to %4 step %5 {
        %h = memref.alloca() : memref<3xf32>
        %6 = arith.constant 0.000000e+00 : f32
        %7 = arith.constant 0 : index
        %8 = arith.constant 3 : index
        %9 = arith.constant 1 : index
        scf.for %n = %7 to %8 step %9 {
          memref.store %6, %h[%n] : memref<3xf32>
        }
        %10 = arith.constant 0 : index
        %11 = arith.constant 4 : index
        %12 = arith.constant 1 : index
        scf.for %t = %10 to %11 step %12 {
          %13 = memref.load %u[%b, %d, %t] : memref<1x2x4xf32>
          %14 = memref.load %delta[%b, %d, %t] : memref<1x2x4xf32>
          %15 = memref.load %delta_bias[%d] : memref<2xf32>
          %16 = arith.addf %14, %15 : f32
          %17 = math.exp %16 : f32
          %18 = math.log1p %17 : f32
          %19 = arith.constant 2.000000e+01 : f32
          %20 = arith.cmpf ogt, %16, %19 : f32
          %21 = arith.select %20, %16, %18 : f32
          %22 = arith.mulf %21, %13 : f32
          %23 = arith.constant 0.000000e+00 : f32
          %24 = arith.constant 0 : index
          %25 = arith.constant 3 : index
          %26 = arith.constant 1 : index
          %27 = scf.for %n_1 = %24 to %25 step %26 iter_args(%28 = %23) -> (f32) {
            %29 = memref.load %h[%n_1] : memref<3xf32>
            %30 = memref.load %A[%d, %n_1] : memref<2x3xf32>
            %31 = arith.mulf %21, %30 : f32
            %32 = math.exp %31 : f32
            %33 = arith.constant 1 : index
            %34 = arith.divui %d, %33 : index
            %35 = memref.load %B[%b, %34, %n_1, %t] : memref<1x2x3x4xf32>
            %36 = arith.mulf %22, %35 : f32
            %37 = arith.mulf %32, %29 : f32
            %38 = arith.addf %37, %36 : f32
            memref.store %38, %h[%n_1] : memref<3xf32>
            %39 = arith.constant 1 : index
            %40 = arith.divui %d, %39 : index
            %41 = memref.load %C[%b, %40, %n_1, %t] : memref<1x2x3x4xf32>
            %42 = arith.mulf %38, %41 : f32
            %43 = arith.addf %28, %42 : f32
            scf.yield %43 : f32
          }
          %44 = memref.load %D_skip[%d] : memref<2xf32>
          %45 = arith.mulf %44, %13 : f32
          %46 = arith.addf %27, %45 : f32
          memref.store %46, %out[%b, %d, %t] : memref<1x2x4xf32>
        }
      }
    }
    func.return
  }
}

