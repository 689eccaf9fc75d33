func.func @ema_f64(%a: memref<?x?xf64>, %b: memref<?x?xf64>, %y: memref<?x?xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %C = memref.dim %a, %c0 : memref<?x?xf64>
  %L = memref.dim %a, %c1 : memref<?x?xf64>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f64) {
      %av = memref.load %a[%c, %t] : memref<?x?xf64>
      %bv = memref.load %b[%c, %t] : memref<?x?xf64>
      %p = arith.mulf %av, %h : f64
      %hn = arith.addf %p, %bv : f64
      memref.store %hn, %y[%c, %t] : memref<?x?xf64>
      scf.yield %hn : f64
    }
  }
  func.return
}
