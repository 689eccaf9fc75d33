// RUN: xdsl-opt %s -p 'scanweaver-raise{diagnose=true}' 2>&1 | filecheck %s

// h = h*h + b is not affine in a complex state: not raised, and the diagnostic says why.

func.func @square(%b: memref<6xcomplex<f64>>, %h: memref<6xcomplex<f64>>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c6 = arith.constant 6 : index
  %z = complex.constant [0.0 : f64, 0.0 : f64] : complex<f64>
  %r = scf.for %i = %c0 to %c6 step %c1 iter_args(%s = %z) -> (complex<f64>) {
    %bv = memref.load %b[%i] : memref<6xcomplex<f64>>
    %p = complex.mul %s, %s : complex<f64>
    %n = complex.add %p, %bv : complex<f64>
    memref.store %n, %h[%i] : memref<6xcomplex<f64>>
    scf.yield %n : complex<f64>
  }
  func.return
}

// CHECK: complex.mul h*h
// CHECK-NOT: scan.recurrence
// CHECK: complex.mul %s, %s
