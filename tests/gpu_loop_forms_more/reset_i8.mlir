func.func @reset_i8(%x: memref<?x?xf32>, %m: memref<?x?xi8>, %alpha: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %z8 = arith.constant 0 : i8
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %mv = memref.load %m[%c, %t] : memref<?x?xi8>
      %on = arith.cmpi ne, %mv, %z8 : i8
      %a = arith.select %on, %zero, %alpha : f32
      %ah = arith.mulf %a, %h : f32
      %hn = arith.addf %ah, %xv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
