// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=8 items-per-thread=4}' | filecheck %s

// The selective scan of recurrence_element_loads.mlir at N = 40: its element-only values
// (A[d, n], 40 per channel) pass the registers' budget (32), so they go into one shared
// array of the block, sE (40 floats): thread 0 loads A and writes sE once (when the loop
// runs at all), a barrier, then every step reads sE where it uses A; A is never loaded
// inside the tile loop (before, once per step and element, in phase 1 and the replay).

// CHECK:       "memref.global"() <{sym_name = "scan_recurrence_0_sE", type = memref<40xf32, 3 : i64>
// CHECK:       "gpu.func"
// CHECK:         %[[SE:.*]] = memref.get_global @scan_recurrence_0_sE : memref<40xf32, 3 : i64>
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      %[[A0:.*]] = memref.load %A[%{{.*}}, %{{.*}}] : memref<2x40xf32>
// CHECK-NEXT:      memref.store %[[A0]], %[[SE]][%{{.*}}] : memref<40xf32, 3 : i64>
// CHECK-COUNT-39:  memref.store %{{.*}}, %[[SE]][%{{.*}}] : memref<40xf32, 3 : i64>
// CHECK-NEXT:    }
// CHECK-NEXT:    "gpu.barrier"() : () -> ()
// CHECK-NOT:     memref.load %A
// CHECK:         scf.for
// CHECK-NOT:       memref.load %A
// CHECK-COUNT-40:  memref.load %[[SE]][%{{.*}}] : memref<40xf32, 3 : i64>
// CHECK-NOT:       memref.load %A
// CHECK:         "gpu.return"

builtin.module {
  func.func @selective_scan(%u: memref<1x2x64xf32>, %delta: memref<1x2x64xf32>, %A: memref<2x40xf32>, %B: memref<1x40x64xf32>, %C: memref<1x40x64xf32>, %out: memref<1x2x64xf32>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 1 : index
    %2 = arith.constant 1 : index
    scf.for %b = %0 to %1 step %2 {
      %3 = arith.constant 0 : index
      %4 = arith.constant 2 : index
      %5 = arith.constant 1 : index
      scf.for %d = %3 to %4 step %5 {
        %h = memref.alloca() : memref<40xf32>
        %6 = arith.constant 0.000000e+00 : f32
        %7 = arith.constant 0 : index
        %8 = arith.constant 40 : index
        %9 = arith.constant 1 : index
        scf.for %n = %7 to %8 step %9 {
          memref.store %6, %h[%n] : memref<40xf32>
        }
        %10 = arith.constant 0 : index
        %11 = arith.constant 64 : index
        %12 = arith.constant 1 : index
        scan.recurrence %10 to %11 step %12 state(%h : memref<40xf32>) coeffs {
        ^bb0(%t: index, %n_1: index):
          %13 = memref.load %delta[%b, %d, %t] : memref<1x2x64xf32>
          %14 = memref.load %A[%d, %n_1] : memref<2x40xf32>
          %15 = arith.mulf %13, %14 : f32
          %16 = math.exp %15 : f32
          %17 = memref.load %u[%b, %d, %t] : memref<1x2x64xf32>
          %18 = arith.mulf %13, %17 : f32
          %19 = memref.load %B[%b, %n_1, %t] : memref<1x40x64xf32>
          %20 = arith.mulf %18, %19 : f32
          scan.yield %16, %20 : f32, f32
        } emit {
        ^bb0(%t_1: index, %21: memref<40xf32>):
          %22 = arith.constant 0.000000e+00 : f32
          %23 = arith.constant 0 : index
          %24 = arith.constant 40 : index
          %25 = arith.constant 1 : index
          %26 = scf.for %n_2 = %23 to %24 step %25 iter_args(%27 = %22) -> (f32) {
            %28 = memref.load %21[%n_2] : memref<40xf32>
            %29 = memref.load %C[%b, %n_2, %t_1] : memref<1x40x64xf32>
            %30 = arith.mulf %28, %29 : f32
            %31 = arith.addf %27, %30 : f32
            scf.yield %31 : f32
          }
          memref.store %26, %out[%b, %d, %t_1] : memref<1x2x64xf32>
          scan.yield
        }
      }
    }
    func.return
  }
}

