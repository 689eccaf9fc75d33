func.func @chan_step2(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %a, %c0 : memref<?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?xf32>
  %Lm5 = arith.subi %L, %c5 : index
  scf.for %c = %c0 to %c3 step %c2 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %bv = memref.load %b[%c, %t] : memref<?x?xf32>
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
