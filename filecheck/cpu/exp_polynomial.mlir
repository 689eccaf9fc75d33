// RUN: xdsl-opt %s -p math-exp-to-polynomial | filecheck %s
// f32 math.exp, scalar or vector, becomes arith ops: round-to-nearest by the 1.5*2^23
// trick, Cody-Waite reduction, a Horner polynomial, 2^k added into the exponent bits.

func.func @vec(%x: vector<16xf32>) -> vector<16xf32> {
  %e = math.exp %x : vector<16xf32>
  func.return %e : vector<16xf32>
}
// CHECK-LABEL: func.func @vec
// CHECK-NOT:     math.exp
// CHECK:         arith.constant 0x4B400000 : f32
// CHECK:         arith.bitcast %{{.*}} : vector<16xf32> to vector<16xi32>
// CHECK:         arith.shli %{{.*}}, %{{.*}} : vector<16xi32>
// CHECK:         arith.bitcast %{{.*}} : vector<16xi32> to vector<16xf32>
// CHECK:         func.return

func.func @scalar(%x: f32) -> f32 {
  %e = math.exp %x : f32
  func.return %e : f32
}
// CHECK-LABEL: func.func @scalar
// CHECK-NOT:     math.exp
// CHECK:         arith.select

func.func @double(%x: f64) -> f64 {
  %e = math.exp %x : f64
  func.return %e : f64
}
// CHECK-LABEL: func.func @double
// CHECK:         math.exp %{{.*}} : f64
