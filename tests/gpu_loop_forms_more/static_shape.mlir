func.func @static_shape(%a: memref<5x37xf32>, %b: memref<5x37xf32>, %y: memref<5x37xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c5 = arith.constant 5 : index
  %c37 = arith.constant 37 : index
  %zero = arith.constant 0.0 : f32
  scf.for %c = %c0 to %c5 step %c1 {
    %r = scf.for %t = %c0 to %c37 step %c1 iter_args(%h = %zero) -> (f32) {
      %av = memref.load %a[%c, %t] : memref<5x37xf32>
      %bv = memref.load %b[%c, %t] : memref<5x37xf32>
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %y[%c, %t] : memref<5x37xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
