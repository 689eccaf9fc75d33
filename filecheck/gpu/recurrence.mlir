// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=4 items-per-thread=2}' | filecheck %s
// A raised recurrence in its channel loop becomes one fused kernel: prologue (state
// alloca + init) per thread, hoisted per-element coefficients, per-item coeffs clones
// folded into N=2 aggregates, one Blelloch sweep over both components, replay + emit
// on the private state, carry through shared memory, epilogue by thread 0.

func.func @decay2(%x: memref<3x?xf32>, %A: memref<3x2xf32>, %h0: memref<3x2xf32>, %y: memref<3x?xf32>, %hT: memref<3x2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %L = memref.dim %x, %c1 : memref<3x?xf32>
  scf.for %c = %c0 to %c3 step %c1 {
    %h = memref.alloca() : memref<2xf32>
    scf.for %n = %c0 to %c2 step %c1 {
      %v = memref.load %h0[%c, %n] : memref<3x2xf32>
      memref.store %v, %h[%n] : memref<2xf32>
    }
    scan.recurrence %c0 to %L step %c1 state(%h : memref<2xf32>) coeffs {
    ^bb0(%t: index, %n: index):
      %a = memref.load %A[%c, %n] : memref<3x2xf32>
      %u = memref.load %x[%c, %t] : memref<3x?xf32>
      scan.yield %a, %u : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<2xf32>):
      %s0 = memref.load %s[%c0] : memref<2xf32>
      %s1 = memref.load %s[%c1] : memref<2xf32>
      %r = arith.addf %s0, %s1 : f32
      memref.store %r, %y[%c, %t] : memref<3x?xf32>
      scan.yield
    }
    scf.for %n = %c0 to %c2 step %c1 {
      %v = memref.load %h[%n] : memref<2xf32>
      memref.store %v, %hT[%c, %n] : memref<3x2xf32>
    }
  }
  func.return
}

// CHECK:       builtin.module attributes {gpu.container_module} {
// CHECK-LABEL:   func.func @decay2
// CHECK-NOT:       scf.for
// CHECK:           "gpu.launch_func"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %x, %A, %h0, %y, %hT) <{kernel = @scanweaver_kernels::@scan_recurrence_0
// CHECK-NOT:       scan.recurrence
// CHECK-NEXT:      func.return
// CHECK:         "gpu.module"() <{sym_name = "scanweaver_kernels"}> ({
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_recurrence_0_sA", type = memref<8xf32, 3 : i64>, initial_value
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_recurrence_0_sB", type = memref<8xf32, 3 : i64>, initial_value
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_recurrence_0_sC", type = memref<2xf32, 3 : i64>, initial_value
// CHECK:           "gpu.func"() <{function_type = (memref<3x?xf32>, memref<3x2xf32>, memref<3x2xf32>, memref<3x?xf32>, memref<3x2xf32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x: memref<3x?xf32>, %A: memref<3x2xf32>, %h0: memref<3x2xf32>, %y: memref<3x?xf32>, %hT: memref<3x2xf32>):
// CHECK-NEXT:        %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK-NEXT:        %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
//                    prologue per thread: private state alloca, initialised from h0[channel]
// CHECK:             %[[H:.*]] = memref.alloca() : memref<2xf32>
// CHECK:               memref.load %h0[%[[BID]], %{{.*}}] : memref<3x2xf32>
// CHECK:             %[[SC:.*]] = memref.get_global @scan_recurrence_0_sC
//                    thread 0 seeds the carry with the initial state
// CHECK:             scf.if
// CHECK:               memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
//                    per-element coefficients hoisted, guarded by a non-empty sequence
// CHECK:             %[[A0:.*]], %[[A1:.*]] = scf.if %{{.*}} -> (f32, f32) {
// CHECK-NEXT:          memref.load %A[%[[BID]], %{{.*}}] : memref<3x2xf32>
// CHECK-NEXT:          memref.load %A[%[[BID]], %{{.*}}] : memref<3x2xf32>
//                    tiles: per-item pairs for both elements (identity past the end)
// CHECK:             scf.for
// CHECK:               scf.if %{{.*}} -> (f32, f32, f32, f32) {
// CHECK-NEXT:            %[[U:.*]] = memref.load %x[%[[BID]], %{{.*}}] : memref<3x?xf32>
// CHECK-NEXT:            scf.yield %[[A0]], %[[A1]], %[[U]], %[[U]] : f32, f32, f32, f32
// CHECK:               scf.if %{{.*}} -> (f32, f32, f32, f32) {
//                      one Blelloch sweep over both components: 2 up, seed, 2 down levels
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK:               scf.if
// CHECK:                 memref.load %[[SC]]
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK:               "gpu.barrier"() : () -> ()
//                      replay: the new state goes to the private buffer, then the emit
// CHECK:               scf.if %{{.*}} -> (f32, f32) {
// CHECK:                 memref.store %{{.*}}, %[[H]][%{{.*}}] : memref<2xf32>
// CHECK:                 memref.store %{{.*}}, %[[H]][%{{.*}}] : memref<2xf32>
// CHECK:                 memref.load %[[H]][%{{.*}}] : memref<2xf32>
// CHECK:                 memref.store %{{.*}}, %y[%[[BID]], %{{.*}}] : memref<3x?xf32>
// CHECK:               scf.if %{{.*}} -> (f32, f32) {
//                      the last thread publishes the carry
// CHECK:               scf.if
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]]
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]]
// CHECK-NEXT:          }
// CHECK-NEXT:        }
//                    after the last tile: thread 0 runs the epilogue on the final state
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK:             scf.if
// CHECK:               memref.load %[[SC]]
// CHECK:               scf.for
// CHECK:                 memref.store %{{.*}}, %hT[%[[BID]], %{{.*}}] : memref<3x2xf32>
// CHECK:             "gpu.return"() : () -> ()
// CHECK:           }) {sym_name = "scan_recurrence_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_recurrence_0", module_name = "scanweaver_kernels", func_name = "decay2", grid = [3 : i64, 1 : i64, 1 : i64], block = [4 : i64, 1 : i64, 1 : i64], shared_bytes = 72 : i64
// CHECK-NOT:     scan.recurrence %
