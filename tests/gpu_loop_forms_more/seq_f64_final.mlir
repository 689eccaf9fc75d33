func.func @seq_f64_final(%a: memref<?xf64>, %b: memref<?xf64>, %last: memref<1xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %L = memref.dim %a, %c0 : memref<?xf64>
  %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f64) {
    %av = memref.load %a[%t] : memref<?xf64>
    %bv = memref.load %b[%t] : memref<?xf64>
    %p = arith.mulf %av, %h : f64
    %hn = arith.addf %p, %bv : f64
    scf.yield %hn : f64
  }
  memref.store %r, %last[%c0] : memref<1xf64>
  func.return
}
