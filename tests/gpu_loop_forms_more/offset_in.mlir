func.func @offset_in(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %a, %c0 : memref<?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?xf32>
  %Lm1 = arith.subi %L, %c1 : index
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %Lm1 step %c1 iter_args(%h = %zero) -> (f32) {
      %t1 = arith.addi %t, %c1 : index
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %bv = memref.load %b[%c, %t1] : memref<?x?xf32>
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %y[%c, %t1] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
