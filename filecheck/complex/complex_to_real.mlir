// RUN: xdsl-opt %s -p scan-complex-to-real | filecheck %s

// scan-complex-to-real: complex.mul then complex.add of a loop-carried complex value
// become real arithmetic on (re, im); re(create(x, y)) folds, so only the iter_arg
// and the memref element stay complex (MLIR's convert-complex-to-llvm maps those).

func.func @step(%a: memref<8xcomplex<f32>>, %b: memref<8xcomplex<f32>>, %h: memref<8xcomplex<f32>>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %z = complex.constant [0.0 : f32, 0.0 : f32] : complex<f32>
  %r = scf.for %i = %c0 to %c8 step %c1 iter_args(%s = %z) -> (complex<f32>) {
    %av = memref.load %a[%i] : memref<8xcomplex<f32>>
    %bv = memref.load %b[%i] : memref<8xcomplex<f32>>
    %p = complex.mul %av, %s : complex<f32>
    %n = complex.add %p, %bv : complex<f32>
    memref.store %n, %h[%i] : memref<8xcomplex<f32>>
    scf.yield %n : complex<f32>
  }
  func.return
}

// CHECK-LABEL: func.func @step
// CHECK:         scf.for %{{.*}} iter_args(%[[S:.*]] = %{{.*}}) -> (complex<f32>) {
// CHECK-DAG:       %[[AR:.*]] = complex.re %[[AV:.*]] : complex<f32>
// CHECK-DAG:       %[[AI:.*]] = complex.im %[[AV]] : complex<f32>
// CHECK-DAG:       %[[SR:.*]] = complex.re %[[S]] : complex<f32>
// CHECK-DAG:       %[[SI:.*]] = complex.im %[[S]] : complex<f32>
// CHECK:           %[[P1:.*]] = arith.mulf %[[AR]], %[[SR]] : f32
// CHECK-NEXT:      %[[P2:.*]] = arith.mulf %[[AI]], %[[SI]] : f32
// CHECK-NEXT:      %[[RE:.*]] = arith.subf %[[P1]], %[[P2]] : f32
// CHECK-NEXT:      %[[P3:.*]] = arith.mulf %[[AR]], %[[SI]] : f32
// CHECK-NEXT:      %[[P4:.*]] = arith.mulf %[[AI]], %[[SR]] : f32
// CHECK-NEXT:      %[[IM:.*]] = arith.addf %[[P3]], %[[P4]] : f32
// CHECK:           %[[NR:.*]] = arith.addf %[[RE]], %{{.*}} : f32
// CHECK:           %[[NI:.*]] = arith.addf %[[IM]], %{{.*}} : f32
// CHECK-NEXT:      %[[N:.*]] = complex.create %[[NR]], %[[NI]] : complex<f32>
// CHECK-NEXT:      memref.store %[[N]], %h[%{{.*}}] : memref<8xcomplex<f32>>
// CHECK-NEXT:      scf.yield %[[N]] : complex<f32>
// CHECK-NOT:     complex.mul
// CHECK-NOT:     complex.add
