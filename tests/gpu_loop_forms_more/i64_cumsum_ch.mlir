func.func @i64_cumsum_ch(%x: memref<?x?xi64>, %y: memref<?x?xi64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i64
  %C = memref.dim %x, %c0 : memref<?x?xi64>
  %L = memref.dim %x, %c1 : memref<?x?xi64>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (i64) {
      %xv = memref.load %x[%c, %t] : memref<?x?xi64>
      %hn = arith.addi %xv, %h : i64
      memref.store %hn, %y[%c, %t] : memref<?x?xi64>
      scf.yield %hn : i64
    }
  }
  func.return
}
