func.func @gather(%x: memref<?x?xf32>, %at: memref<?x?xi32>, %k: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %y, %c0 : memref<?x?xf32>
  %L = memref.dim %y, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %a = memref.load %at[%c, %t] : memref<?x?xi32>
      %i = arith.index_cast %a : i32 to index
      %xv = memref.load %x[%c, %i] : memref<?x?xf32>
      %p = arith.mulf %k, %h : f32
      %hn = arith.addf %p, %xv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
