func.func @mixed_mask(%x: memref<?x?xf32>, %k: f32, %y: memref<?x?xf32>, %n: memref<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %z32 = arith.constant 0 : i32
  %one32 = arith.constant 1 : i32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%cnt = %z32, %h = %zero) -> (i32, f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %pos = arith.cmpf ogt, %xv, %zero : f32
      %m = arith.select %pos, %one32, %z32 : i32
      %cn = arith.addi %cnt, %m : i32
      %p = arith.mulf %k, %h : f32
      %hn = arith.addf %p, %xv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      memref.store %cn, %n[%c, %t] : memref<?x?xi32>
      scf.yield %cn, %hn : i32, f32
    }
  }
  func.return
}
