func.func @i32_scalar_ch(%x: memref<?x?xi32>, %k: i32, %y: memref<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i32
  %C = memref.dim %x, %c0 : memref<?x?xi32>
  %L = memref.dim %x, %c1 : memref<?x?xi32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (i32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xi32>
      %p = arith.muli %k, %h : i32
      %hn = arith.addi %p, %xv : i32
      memref.store %hn, %y[%c, %t] : memref<?x?xi32>
      scf.yield %hn : i32
    }
  }
  func.return
}
