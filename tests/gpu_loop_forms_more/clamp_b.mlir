func.func @clamp_b(%a: memref<?x?xf32>, %x: memref<?x?xf32>, %lo: f32, %hi: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %a, %c0 : memref<?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %m1 = arith.maximumf %xv, %lo : f32
      %bv = arith.minimumf %m1, %hi : f32
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
