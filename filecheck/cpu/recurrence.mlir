// RUN: xdsl-opt %s -p "scan-to-cpu,math-exp-to-polynomial{marked_only=true}" | filecheck %s
// A recurrence with a 16-element state: the state stays in a vector<16xf32> register
// value, the coefficients are vectorised over the state index (vector loads, the
// polynomial exp), the consumer's reduction over the state becomes vector.reduction,
// and time-only work (softplus) is computed 16 steps at a time, one block ahead, and
// each step takes its element of the block's vector by a vector.extract.

func.func @selective(%A: memref<16xf32>, %Bt: memref<?x16xf32>, %Ct: memref<?x16xf32>, %dl: memref<?xf32>, %y: memref<?xf32>, %h: memref<16xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %len = memref.dim %dl, %c0 : memref<?xf32>
  %zero = arith.constant 0.0 : f32
  scan.recurrence %c0 to %len step %c1 state(%h : memref<16xf32>) coeffs {
  ^bb0(%i: index, %n: index):
    %d = memref.load %dl[%i] : memref<?xf32>
    %e = math.exp %d : f32
    %dt = math.log1p %e : f32
    %an = memref.load %A[%n] : memref<16xf32>
    %p = arith.mulf %dt, %an : f32
    %a = math.exp %p : f32
    %bn = memref.load %Bt[%i, %n] : memref<?x16xf32>
    %x = arith.mulf %dt, %bn : f32
    scan.yield %a, %x : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<16xf32>):
    %acc = scf.for %k = %c0 to %c16 step %c1 iter_args(%r = %zero) -> (f32) {
      %hv = memref.load %s[%k] : memref<16xf32>
      %cv = memref.load %Ct[%t, %k] : memref<?x16xf32>
      %m = arith.mulf %hv, %cv : f32
      %r2 = arith.addf %r, %m : f32
      scf.yield %r2 : f32
    }
    memref.store %acc, %y[%t] : memref<?xf32>
    scan.yield
  }
  func.return
}
// CHECK-LABEL: func.func @selective
// CHECK-NOT:     scan.recurrence
// CHECK-NOT:     memref.alloca
// CHECK:         %[[H0:.*]] = vector.load %h[%{{.*}}] : memref<16xf32>, vector<16xf32>
// The first block's prologue is computed before the loop (only when the loop has a block);
// each iteration computes the next block's, and its steps extract theirs from the carried one.
// CHECK:         %[[P0:.*]] = scf.if %{{.*}} -> (vector<16xf32>) {
// CHECK:           vector.load %dl[%{{.*}}] : memref<?xf32>, vector<16xf32>
// CHECK:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %[[H0]], %[[P:.*]] = %[[P0]]) -> (vector<16xf32>, vector<16xf32>) {
// CHECK:           vector.load %dl[%{{.*}}] : memref<?xf32>, vector<16xf32>
// CHECK-NOT:       llvm.load
// CHECK:           vector.extract %[[P]][0] : f32 from vector<16xf32>
// CHECK:           vector.load %A[%{{.*}}] : memref<16xf32>, vector<16xf32>
// CHECK:           arith.bitcast %{{.*}} : vector<16xf32> to vector<16xi32>
// CHECK:           vector.load %Bt[%{{.*}}, %{{.*}}] : memref<?x16xf32>, vector<16xf32>
// CHECK:           vector.reduction <add>, %{{.*}}, %{{.*}} fastmath<reassoc> : vector<16xf32> into f32
// CHECK:           memref.store %{{.*}}, %y[%{{.*}}] : memref<?xf32>
// CHECK-NOT:     math.exp %{{.*}} : vector
// CHECK:         vector.store %{{.*}}, %h[%{{.*}}] : memref<16xf32>, vector<16xf32>
