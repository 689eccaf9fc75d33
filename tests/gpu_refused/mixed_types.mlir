func.func @mixed_types(%x: memref<?x?xf32>, %k: f32, %y: memref<?x?xf32>, %n: memref<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %z32 = arith.constant 0 : i32
  %one32 = arith.constant 1 : i32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero, %cnt = %z32) -> (f32, i32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %p = arith.mulf %k, %h : f32
      %hn = arith.addf %p, %xv : f32
      %cn = arith.addi %cnt, %one32 : i32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      memref.store %cn, %n[%c, %t] : memref<?x?xi32>
      scf.yield %hn, %cn : f32, i32
    }
  }
  func.return
}
