func.func @channel_program_direct(%x: memref<?x?x?xf32>, %y: memref<?x?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %k = arith.constant 0.5 : f32
  %B = memref.dim %y, %c0 : memref<?x?x?xf32>
  %C = memref.dim %y, %c1 : memref<?x?x?xf32>
  %L = memref.dim %y, %c2 : memref<?x?x?xf32>
  scf.for %b = %c0 to %B step %c1 {
    %s = memref.alloca() : memref<f32>
    memref.store %zero, %s[] : memref<f32>
    scf.for %c = %c0 to %C step %c1 {
      %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
        %xv = memref.load %x[%b, %c, %t] : memref<?x?x?xf32>
        %p = arith.mulf %k, %h : f32
        %hn = arith.addf %p, %xv : f32
        memref.store %hn, %y[%b, %c, %t] : memref<?x?x?xf32>
        scf.yield %hn : f32
      }
    }
  }
  func.return
}
