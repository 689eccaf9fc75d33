func.func @scalar_f64(%x: memref<?x?xf64>, %alpha: f64, %bias: f64, %y: memref<?x?xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %C = memref.dim %x, %c0 : memref<?x?xf64>
  %L = memref.dim %x, %c1 : memref<?x?xf64>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f64) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf64>
      %p = arith.mulf %alpha, %h : f64
      %q = arith.addf %xv, %bias : f64
      %hn = arith.addf %p, %q : f64
      memref.store %hn, %y[%c, %t] : memref<?x?xf64>
      scf.yield %hn : f64
    }
  }
  func.return
}
