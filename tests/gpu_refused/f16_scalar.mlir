func.func @f16_scalar(%x: memref<?x?xf16>, %alpha: f16, %y: memref<?x?xf16>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f16
  %C = memref.dim %x, %c0 : memref<?x?xf16>
  %L = memref.dim %x, %c1 : memref<?x?xf16>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f16) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf16>
      %p = arith.mulf %alpha, %h : f16
      %hn = arith.addf %p, %xv : f16
      memref.store %hn, %y[%c, %t] : memref<?x?xf16>
      scf.yield %hn : f16
    }
  }
  func.return
}
