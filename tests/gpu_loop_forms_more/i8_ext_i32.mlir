func.func @i8_ext_i32(%x: memref<?x?xi8>, %y: memref<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i32
  %C = memref.dim %x, %c0 : memref<?x?xi8>
  %L = memref.dim %x, %c1 : memref<?x?xi8>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (i32) {
      %xv8 = memref.load %x[%c, %t] : memref<?x?xi8>
      %xv = arith.extsi %xv8 : i8 to i32
      %hn = arith.addi %h, %xv : i32
      memref.store %hn, %y[%c, %t] : memref<?x?xi32>
      scf.yield %hn : i32
    }
  }
  func.return
}
