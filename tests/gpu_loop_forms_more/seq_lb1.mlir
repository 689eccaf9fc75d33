func.func @seq_lb1(%a: memref<?xf32>, %b: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %L = memref.dim %a, %c0 : memref<?xf32>
  %h0 = memref.load %b[%c0] : memref<?xf32>
  memref.store %h0, %y[%c0] : memref<?xf32>
  %r = scf.for %t = %c1 to %L step %c1 iter_args(%h = %h0) -> (f32) {
    %av = memref.load %a[%t] : memref<?xf32>
    %bv = memref.load %b[%t] : memref<?xf32>
    %p = arith.mulf %av, %h : f32
    %hn = arith.addf %p, %bv : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  func.return
}
