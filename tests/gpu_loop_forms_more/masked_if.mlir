func.func @masked_if(%x: memref<?x?xf32>, %m: memref<?x?xi32>, %k: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %z32 = arith.constant 0 : i32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %mv = memref.load %m[%c, %t] : memref<?x?xi32>
      %on = arith.cmpi ne, %mv, %z32 : i32
      %hn = scf.if %on -> (f32) {
        %p = arith.mulf %k, %h : f32
        %s = arith.addf %p, %xv : f32
        scf.yield %s : f32
      } else {
        scf.yield %h : f32
      }
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
