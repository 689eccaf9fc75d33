// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=4 items-per-thread=2}' | filecheck %s
// A raised recurrence in its channel loop becomes one fused kernel: prologue (state
// alloca + init) per thread, hoisted per-element coefficients, per-item coeffs clones
// folded into N=2 aggregates, a Kogge-Stone warp-shuffle scan of each component (a
// block of 4 threads is one warp: no warp totals, no barrier in a finite tile), the
// entering state from the previous lane, replay + emit on the private state, the carry
// in registers (broadcast from the last lane by shuffle idx), epilogue by thread 0.

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
//                  one warp: the warp-total arrays are empty, the carry sC holds the state
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_recurrence_0_sA", type = memref<0xf32, 3 : i64>, initial_value
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_recurrence_0_sB", type = memref<0xf32, 3 : i64>, initial_value
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
// CHECK:               memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
//                    per-element coefficients hoisted, guarded by a non-empty sequence
// CHECK:             %[[A0:.*]], %[[A1:.*]] = scf.if %{{.*}} -> (f32, f32) {
// CHECK-NEXT:          memref.load %A[%[[BID]], %{{.*}}] : memref<3x2xf32>
// CHECK-NEXT:          memref.load %A[%[[BID]], %{{.*}}] : memref<3x2xf32>
//                    one barrier, then every thread holds the carry in registers
// CHECK:             "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %[[C0:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:        %[[C1:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-DAG:         %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-DAG:         %[[W:.*]] = arith.constant 4 : i32
// CHECK-DAG:         %[[TWO:.*]] = arith.constant 2 : i32
// CHECK-DAG:         %[[LAST:.*]] = arith.constant 3 : i32
// CHECK-NOT:         "gpu.barrier"
// CHECK:             %[[CA:.*]], %[[CB:.*]] = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[R0:.*]] = %[[C0]], %[[R1:.*]] = %[[C1]]) -> (f32, f32) {
//                      tiles: per-item pairs for both elements (identity past the end)
// CHECK:               %[[IN0:.*]] = arith.cmpi ult, %[[T0:.*]], %L : index
// CHECK-NEXT:          %[[PA0:.*]], %[[PA1:.*]], %[[PB0:.*]], %[[PB1:.*]] = scf.if %[[IN0]] -> (f32, f32, f32, f32) {
// CHECK-NEXT:            %[[U:.*]] = memref.load %x[%[[BID]], %[[T0]]] : memref<3x?xf32>
// CHECK-NEXT:            scf.yield %[[A0]], %[[A1]], %[[U]], %[[U]] : f32, f32, f32, f32
// CHECK-NEXT:          } else {
// CHECK-NEXT:            scf.yield %[[ONEF:.*]], %[[ONEF]], %[[ZEROF:.*]], %[[ZEROF]] : f32, f32, f32, f32
// CHECK:               %[[IN1:.*]] = arith.cmpi ult, %[[T1:.*]], %L : index
// CHECK-NEXT:          %[[QA0:.*]], %[[QA1:.*]], %[[QB0:.*]], %[[QB1:.*]] = scf.if %[[IN1]] -> (f32, f32, f32, f32) {
// CHECK-NEXT:            %[[U1:.*]] = memref.load %x[%[[BID]], %[[T1]]] : memref<3x?xf32>
// CHECK-NEXT:            scf.yield %[[A0]], %[[A1]], %[[U1]], %[[U1]] : f32, f32, f32, f32
//                      the thread's aggregate per element: (a0 a1, a1 b0 + b1)
// CHECK:               %[[GA0:.*]] = arith.mulf %[[PA0]], %[[QA0]] : f32
// CHECK-NEXT:          %[[GB0M:.*]] = arith.mulf %[[QA0]], %[[PB0]] : f32
// CHECK-NEXT:          %[[GB0:.*]] = arith.addf %[[GB0M]], %[[QB0]] : f32
// CHECK-NEXT:          %[[GA1:.*]] = arith.mulf %[[PA1]], %[[QA1]] : f32
// CHECK-NEXT:          %[[GB1M:.*]] = arith.mulf %[[QA1]], %[[PB1]] : f32
// CHECK-NEXT:          %[[GB1:.*]] = arith.addf %[[GB1M]], %[[QB1]] : f32
//                      Kogge-Stone in the warp, element 0: offsets 1 and 2 (shuffle up),
//                      a lane without a source keeps its own aggregate
// CHECK-NEXT:          %[[X1A:.*]], %[[OK1:.*]] = "gpu.shuffle"(%[[GA0]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[X1B:.*]], %{{.*}} = "gpu.shuffle"(%[[GB0]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[Y1A:.*]] = arith.mulf %[[X1A]], %[[GA0]] : f32
// CHECK-NEXT:          %[[Y1BM:.*]] = arith.mulf %[[GA0]], %[[X1B]] : f32
// CHECK-NEXT:          %[[Y1B:.*]] = arith.addf %[[Y1BM]], %[[GB0]] : f32
// CHECK-NEXT:          %[[Z1A:.*]] = arith.select %[[OK1]], %[[Y1A]], %[[GA0]] : f32
// CHECK-NEXT:          %[[Z1B:.*]] = arith.select %[[OK1]], %[[Y1B]], %[[GB0]] : f32
// CHECK-NEXT:          %[[X2A:.*]], %[[OK2:.*]] = "gpu.shuffle"(%[[Z1A]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[X2B:.*]], %{{.*}} = "gpu.shuffle"(%[[Z1B]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[Y2A:.*]] = arith.mulf %[[X2A]], %[[Z1A]] : f32
// CHECK-NEXT:          %[[Y2BM:.*]] = arith.mulf %[[Z1A]], %[[X2B]] : f32
// CHECK-NEXT:          %[[Y2B:.*]] = arith.addf %[[Y2BM]], %[[Z1B]] : f32
// CHECK-NEXT:          %[[INA0:.*]] = arith.select %[[OK2]], %[[Y2A]], %[[Z1A]] : f32
// CHECK-NEXT:          %[[INB0:.*]] = arith.select %[[OK2]], %[[Y2B]], %[[Z1B]] : f32
//                      element 1: the same two levels
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[GA1]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[GB1]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK:               %[[Z3A:.*]] = arith.select %{{.*}}, %{{.*}}, %[[GA1]] : f32
// CHECK-NEXT:          %[[Z3B:.*]] = arith.select %{{.*}}, %{{.*}}, %[[GB1]] : f32
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[Z3A]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[Z3B]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK:               %[[INA1:.*]] = arith.select %{{.*}}, %{{.*}}, %[[Z3A]] : f32
// CHECK-NEXT:          %[[INB1:.*]] = arith.select %{{.*}}, %{{.*}}, %[[Z3B]] : f32
//                      overflow verdict: any lane's non-finite inclusive aggregate flags the
//                      warp (x - x != 0 tests, xor butterfly over offsets 1 and 2)
// CHECK-NEXT:          %{{.*}} = arith.subf %[[INA0]], %[[INA0]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[INA1]], %[[INA1]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[INB0]], %[[INB0]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[INB1]], %[[INB1]] : f32
// CHECK:               %[[FLAG:.*]] = arith.select %{{.*}}, %[[ONE]], %{{.*}} : i32
// CHECK-NEXT:          %[[XF1:.*]], %{{.*}} = "gpu.shuffle"(%[[FLAG]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[OR1:.*]] = arith.ori %[[FLAG]], %[[XF1]] : i32
// CHECK-NEXT:          %[[XF2:.*]], %{{.*}} = "gpu.shuffle"(%[[OR1]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[OR2:.*]] = arith.ori %[[OR1]], %[[XF2]] : i32
// CHECK-NEXT:          %[[BAD:.*]] = arith.cmpi ne, %[[OR2]], %{{.*}} : i32
//                      a flagged tile: the loop's order, one thread after the other (barriers),
//                      the first from the register carry, the others from sC
// CHECK-NEXT:          %[[E0:.*]], %[[E1:.*]] = scf.if %[[BAD]] -> (f32, f32) {
// CHECK-NEXT:            %[[FO0:.*]], %[[FO1:.*]] = scf.for
// CHECK-NEXT:              "gpu.barrier"() : () -> ()
// CHECK:                     scf.yield %[[R0]], %[[R1]] : f32, f32
// CHECK:                     memref.load %[[SC]]
// CHECK:                   memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:              memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:              scf.yield
// CHECK-NEXT:            } else {
// CHECK-NEXT:              scf.yield
// CHECK-NEXT:            }
// CHECK-NEXT:            scf.yield
// CHECK-NEXT:          }
// CHECK-NEXT:          scf.yield %[[FO0]], %[[FO1]] : f32, f32
//                      a finite tile: the entering state is the previous lane's state after
//                      its steps (inclusive aggregate applied to the carry, shuffled up by
//                      one); lane 0 enters with the carry. No barrier.
// CHECK-NEXT:          } else {
// CHECK-NEXT:            %[[EM0:.*]] = arith.mulf %[[INA0]], %[[R0]] : f32
// CHECK-NEXT:            %[[EX0:.*]] = arith.addf %[[EM0]], %[[INB0]] : f32
// CHECK-NEXT:            %[[EM1:.*]] = arith.mulf %[[INA1]], %[[R1]] : f32
// CHECK-NEXT:            %[[EX1:.*]] = arith.addf %[[EM1]], %[[INB1]] : f32
// CHECK-NEXT:            %[[EP0:.*]], %[[EOK:.*]] = "gpu.shuffle"(%[[EX0]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:            %[[EP1:.*]], %{{.*}} = "gpu.shuffle"(%[[EX1]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:            %[[ES0:.*]] = arith.select %[[EOK]], %[[EP0]], %[[R0]] : f32
// CHECK-NEXT:            %[[ES1:.*]] = arith.select %[[EOK]], %[[EP1]], %[[R1]] : f32
// CHECK-NEXT:            scf.yield %[[ES0]], %[[ES1]] : f32, f32
// CHECK-NEXT:          }
//                      replay: the new state goes to the private buffer, then the emit
// CHECK-NOT:           "gpu.barrier"
// CHECK-NEXT:          %[[N0:.*]], %[[N1:.*]] = scf.if %[[IN0]] -> (f32, f32) {
// CHECK-NEXT:            %[[RM0:.*]] = arith.mulf %[[PA0]], %[[E0]] : f32
// CHECK-NEXT:            %[[RS0:.*]] = arith.addf %[[RM0]], %[[PB0]] : f32
// CHECK-NEXT:            %[[RM1:.*]] = arith.mulf %[[PA1]], %[[E1]] : f32
// CHECK-NEXT:            %[[RS1:.*]] = arith.addf %[[RM1]], %[[PB1]] : f32
// CHECK-NEXT:            memref.store %[[RS0]], %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.store %[[RS1]], %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.load %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.load %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            arith.addf
// CHECK-NEXT:            memref.store %{{.*}}, %y[%[[BID]], %[[T0]]] : memref<3x?xf32>
// CHECK:               %[[F0:.*]], %[[F1:.*]] = scf.if %[[IN1]] -> (f32, f32) {
// CHECK-NEXT:            %{{.*}} = arith.mulf %[[QA0]], %[[N0]] : f32
// CHECK:                 memref.store %{{.*}}, %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.store %{{.*}}, %[[H]][%{{.*}}] : memref<2xf32>
// CHECK:                 memref.store %{{.*}}, %y[%[[BID]], %[[T1]]] : memref<3x?xf32>
//                      the next tile's carry: the last lane's final state, by shuffle idx
// CHECK-NOT:           "gpu.barrier"
// CHECK:               %[[L0:.*]], %{{.*}} = "gpu.shuffle"(%[[F0]], %[[LAST]], %[[W]]) <{mode = #gpu<shuffle_mode idx>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[L1:.*]], %{{.*}} = "gpu.shuffle"(%[[F1]], %[[LAST]], %[[W]]) <{mode = #gpu<shuffle_mode idx>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          scf.yield %[[L0]], %[[L1]] : f32, f32
// CHECK-NEXT:        }
//                    after the last tile: thread 0 puts the final carry into sC; then thread 0
//                    copies it into its state and runs the epilogue
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %{{.*}} = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:        scf.if %{{.*}} {
// CHECK-NEXT:          memref.store %[[CA]], %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          memref.store %[[CB]], %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:        }
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %{{.*}} = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:        scf.if %{{.*}} {
// CHECK-NEXT:          %[[FS0:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          memref.store %[[FS0]], %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:          %[[FS1:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          memref.store %[[FS1]], %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:          scf.for
// CHECK-NEXT:            %[[HV:.*]] = memref.load %[[H]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.store %[[HV]], %hT[%[[BID]], %{{.*}}] : memref<3x2xf32>
// CHECK:             "gpu.return"() : () -> ()
// CHECK:           }) {sym_name = "scan_recurrence_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_recurrence_0", module_name = "scanweaver_kernels", func_name = "decay2", grid = [3 : i64, 1 : i64, 1 : i64], block = [4 : i64, 1 : i64, 1 : i64], shared_bytes = 8 : i64
// CHECK-SAME:      notes = "scan.recurrence over 1 channel loop(s), state 2 f32; block_size=4 items_per_thread=2; fused coeffs/emit, kept pairs, warp-shuffle scans"
// CHECK-NOT:     scan.recurrence %
