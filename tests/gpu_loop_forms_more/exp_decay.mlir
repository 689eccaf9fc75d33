func.func @exp_decay(%w: memref<?x?xf32>, %x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %wv = memref.load %w[%c, %t] : memref<?x?xf32>
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %nw = arith.negf %wv : f32
      %a = math.exp %nw : f32
      %ah = arith.mulf %a, %h : f32
      %hn = arith.addf %ah, %xv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
