func.func @seq_i64(%a: memref<?xi64>, %b: memref<?xi64>, %k: i64, %y: memref<?xi64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i64
  %L = memref.dim %a, %c0 : memref<?xi64>
  %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (i64) {
    %av = memref.load %a[%t] : memref<?xi64>
    %bv = memref.load %b[%t] : memref<?xi64>
    %p = arith.muli %av, %h : i64
    %q = arith.addi %bv, %k : i64
    %hn = arith.addi %p, %q : i64
    memref.store %hn, %y[%t] : memref<?xi64>
    scf.yield %hn : i64
  }
  func.return
}
