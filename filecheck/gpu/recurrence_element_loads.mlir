// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=8 items-per-thread=4}' | filecheck %s

// Mamba's selective scan at N = 8 with B and C shared across the channels, (batch, N, L):
// each thread owns 4 consecutive steps, so B[b, n, t0 .. t0 + 3] and C[b, n, t0 .. t0 + 3]
// are one 16-byte vector per element n. In a full tile B is read by 8 vectors, each lane
// taken out just before its store to this thread's own slot of the shared stage sS
// ((run * 4 + item) * 8 + tid: 8 runs x 4 items x 8 threads = 256 floats), which phase 1,
// the overflow fallback and the replay read: B is read from global memory once per tile.
// C, read only by the emit, is read by 8 vectors just before the replay; they leave their
// branch whole and are taken apart after it, the emit's dot product over the state
// unrolled so each term takes its lane. A partial tile takes guarded scalar loads. (No
// lane is extracted next to its load: LLVM would split such a load into scalar loads
// without its !invariant.load, toolchain/readonly_params.py.)

// CHECK:       "memref.global"() <{sym_name = "scan_recurrence_0_sS", type = memref<256xf32, 3 : i64>
// CHECK:       "gpu.func"
// CHECK:         %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:         %[[SS:.*]] = memref.get_global @scan_recurrence_0_sS : memref<256xf32, 3 : i64>
// CHECK-NOT:     memref.load %B
// CHECK:         scf.for
// CHECK-NOT:       memref.load %B
// CHECK:           %[[VB:.*]] = arith.andi %[[FULL:.*]], %bases_aligned : i1
// CHECK-NEXT:      scf.if %[[VB]] {
// CHECK-NEXT:        %[[V0:.*]] = vector.load %B[%[[BB:.*]], %{{.*}}, %[[P:.*]]] {alignment = 16 : i64} : memref<1x8x64xf32>, vector<4xf32>
// CHECK-COUNT-7:     vector.load %B[%[[BB]], %{{.*}}, %[[P]]] {alignment = 16 : i64} : memref<1x8x64xf32>, vector<4xf32>
// CHECK-NEXT:        %[[L0:.*]] = vector.extract %[[V0]][0] : f32 from vector<4xf32>
// CHECK-NEXT:        memref.store %[[L0]], %[[SS]][%[[TID]]] : memref<256xf32, 3 : i64>
// CHECK-NEXT:        %[[L1:.*]] = vector.extract %[[V0]][1] : f32 from vector<4xf32>
// CHECK-NEXT:        %[[SLOT1:.*]] = arith.addi %[[TID]], %{{.*}} : index
// CHECK-NEXT:        memref.store %[[L1]], %[[SS]][%[[SLOT1]]] : memref<256xf32, 3 : i64>
// CHECK-COUNT-30:    memref.store %{{.*}}, %[[SS]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:      } else {
// CHECK-COUNT-32:    memref.load %B[%[[BB]], %{{.*}}, %{{.*}}] : memref<1x8x64xf32>
// CHECK-COUNT-32:    memref.store %{{.*}}, %[[SS]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:      }
// CHECK-NOT:       memref.load %B
// CHECK-NOT:       vector.load %B
// CHECK:           %[[VC:.*]] = arith.andi %[[FULL]], %bases_aligned : i1
// CHECK-NEXT:      {{^ *}}%[[C0:[0-9]+]], %{{[^=]*}} = scf.if %[[VC]] -> (vector<4xf32>
// CHECK-NEXT:        vector.load %C[%[[BB]], %{{.*}}, %[[P]]] {alignment = 16 : i64} : memref<1x8x64xf32>, vector<4xf32>
// CHECK-COUNT-7:     vector.load %C[%[[BB]], %{{.*}}, %[[P]]] {alignment = 16 : i64} : memref<1x8x64xf32>, vector<4xf32>
// CHECK-NEXT:        scf.yield
// CHECK-NEXT:      } else {
// CHECK-COUNT-32:    memref.load %C[%[[BB]], %{{.*}}, %{{.*}}] : memref<1x8x64xf32>
// CHECK:             vector.broadcast
// CHECK:           }
// CHECK-NEXT:      vector.extract %[[C0]]{{\[}}0] : f32 from vector<4xf32>
// CHECK-NOT:       memref.load %C
// CHECK-NOT:       memref.load %B
// CHECK:           memref.load %[[SS]][%[[TID]]] : memref<256xf32, 3 : i64>
// CHECK-NOT:       memref.load %B
// CHECK-NOT:       memref.load %C
// CHECK-NOT:       vector.load
// CHECK:         "gpu.return"() : () -> ()

builtin.module {
  func.func @selective_scan(%u: memref<1x2x64xf32>, %delta: memref<1x2x64xf32>, %A: memref<2x8xf32>, %B: memref<1x8x64xf32>, %C: memref<1x8x64xf32>, %out: memref<1x2x64xf32>) {
    %0 = arith.constant 0 : index
    %1 = arith.constant 1 : index
    %2 = arith.constant 1 : index
    scf.for %b = %0 to %1 step %2 {
      %3 = arith.constant 0 : index
      %4 = arith.constant 2 : index
      %5 = arith.constant 1 : index
      scf.for %d = %3 to %4 step %5 {
        %h = memref.alloca() : memref<8xf32>
        %6 = arith.constant 0.000000e+00 : f32
        %7 = arith.constant 0 : index
        %8 = arith.constant 8 : index
        %9 = arith.constant 1 : index
        scf.for %n = %7 to %8 step %9 {
          memref.store %6, %h[%n] : memref<8xf32>
        }
        %10 = arith.constant 0 : index
        %11 = arith.constant 64 : index
        %12 = arith.constant 1 : index
        scan.recurrence %10 to %11 step %12 state(%h : memref<8xf32>) coeffs {
        ^bb0(%t: index, %n_1: index):
          %13 = memref.load %delta[%b, %d, %t] : memref<1x2x64xf32>
          %14 = memref.load %A[%d, %n_1] : memref<2x8xf32>
          %15 = arith.mulf %13, %14 : f32
          %16 = math.exp %15 : f32
          %17 = memref.load %u[%b, %d, %t] : memref<1x2x64xf32>
          %18 = arith.mulf %13, %17 : f32
          %19 = memref.load %B[%b, %n_1, %t] : memref<1x8x64xf32>
          %20 = arith.mulf %18, %19 : f32
          scan.yield %16, %20 : f32, f32
        } emit {
        ^bb0(%t_1: index, %21: memref<8xf32>):
          %22 = arith.constant 0.000000e+00 : f32
          %23 = arith.constant 0 : index
          %24 = arith.constant 8 : index
          %25 = arith.constant 1 : index
          %26 = scf.for %n_2 = %23 to %24 step %25 iter_args(%27 = %22) -> (f32) {
            %28 = memref.load %21[%n_2] : memref<8xf32>
            %29 = memref.load %C[%b, %n_2, %t_1] : memref<1x8x64xf32>
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

