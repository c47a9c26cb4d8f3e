# Multi-rank and command-line tests (included from the top-level CMakeLists.txt).
# MPI gtests run inside mpirun with 2 and 4 ranks, one libtorch thread each, alone (RUN_SERIAL): their
# ranks oversubscribe the cores already, and their timeouts read the clock.
file(GLOB mpi_test_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi/*.cpp)
add_executable(test_mpi ${mpi_test_srcs})
target_link_libraries(test_mpi PRIVATE shardlm_train GTest::gtest)
target_compile_options(test_mpi PRIVATE ${SHARDLM_WARNINGS})
target_precompile_headers(test_mpi REUSE_FROM shardlm_pch)
target_compile_definitions(test_mpi PRIVATE SHARDLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

find_program(MPIRUN mpirun REQUIRED)
set(SHARDLM_TEST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
add_test(NAME mpi_2_ranks COMMAND ${MPIRUN} -n 2 --oversubscribe --bind-to none $<TARGET_FILE:test_mpi>)
# Four ranks run every suite except the ZeRO precision variants and the model families, which shard the
# same way over 2 and 3 ranks (mpi_3_ranks pads the units) and cost about 25 s more here; ZeRO's fp64
# stages, its memory formula, bucket flushes and checkpointing keep 4 ranks (2 x 2 and 4-way shards).
# Context parallelism's masks, fp32 and recomputation run at cp 2 on 2 ranks; 4 ranks keep its modes
# over dp 2 x cp 2, cp 4, ZeRO-3 and the TP and PP compositions. LoRA's tp 2, pp 2, cp 2 and expert-adapter runs stay on 2 ranks
# (their ZeRO-3 compositions, tp or pp 2 x dp 2, on 4).
add_test(NAME mpi_4_ranks
         COMMAND ${MPIRUN} -n 4 --oversubscribe --bind-to none $<TARGET_FILE:test_mpi>
                 --gtest_filter=-Families.*:Zero.WideBf16*:Zero.*Fp32:Zero.*Bf16*:Zero.*Fp16*:Zero.PerUnit*:Zero.Coalesced*:Zero.Stage3GatheredPeak*:Zero.PlannerMatches*:Zero.Stage3Delayed*:ContextParallel.Sliding*:ContextParallel.Packed*:ContextParallel.*Fp32*:ContextParallel.Cp2FullRecompute*:Lora.TensorAndPipeline*:Lora.CheckpointFromPipeline*:Lora.ContextParallel*:Lora.ExpertAdapters*)
foreach(n 2 4)
  set_tests_properties(mpi_${n}_ranks PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV}" TIMEOUT 600 RUN_SERIAL TRUE)
endforeach()
# The suites that drive the collectives through OpenMPI's own implementation (what ranks on
# different nodes use), without the shared-memory path: the collectives themselves, their checks, and
# the strategies built on reductions and gathers over the data-parallel group, and expert parallelism's
# all_to_alls under ZeRO-3 (MPI_Alltoallv itself). Tensor and pipeline
# parallelism, checkpoints and families call the same collectives and run above with both paths'
# results proven equal here (about 40 s of CI left out). ZeRO's precision variants (fp32, bf16, fp16
# against stage 0 in the same dtype, the wide bf16 model), its per-unit loss scaling and its memory and
# planner checks move the same bytes through the same calls as the fp64 stages and run with shared memory
# only (about 12 s).
add_test(NAME mpi_2_ranks_without_shm
         COMMAND ${MPIRUN} -n 2 --oversubscribe --bind-to none -x SHARDLM_COMM_SHM $<TARGET_FILE:test_mpi>
                 --gtest_filter=Collectives.*:CheckedCommunicator.*:Zero.*:DataParallel.*:HybridShard.*:Consistency.*:ExpertParallel.Ep2MixtralWithZero3*-Zero.WideBf16*:Zero.Stage3GatheredPeak*:Zero.PerUnit*:Zero.*Fp16MatchesStage0Fp16:Zero.*Bf16MatchesStage0Bf16:Zero.*MatchesStage0Fp32:Zero.PlannerMatches*:Zero.MemoryPerRank*:HybridShard.*Fp32)
set_tests_properties(mpi_2_ranks_without_shm PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV};SHARDLM_COMM_SHM=0"
                     TIMEOUT 600 RUN_SERIAL TRUE)
# Three data-parallel ranks: units whose sizes 3 does not divide are padded, and the last rank's
# shards end in padding. The tests that cannot run on 3 ranks (an even world, tp or pp 2, ep 2, a
# layout of 4, exactly 2 ranks; CollectiveTimeout runs only under test_all_to_all_timeout.py) are left
# out by name (context parallelism: c = 2 or 4 ranks per sequence), and SHARDLM_TEST_FAIL_ON_SKIP=1 (tests/mpi/mpi_main.cpp) fails the run if a selected
# test skips itself, so this entry never passes on tests that did not run.
add_test(NAME mpi_3_ranks
         COMMAND ${MPIRUN} -n 3 --oversubscribe --bind-to none $<TARGET_FILE:test_mpi>
                 --gtest_filter=-TensorParallel.*:ContextParallel.*:Pipeline.*:PipelineSchedules.*:ParallelDims.*:Consistency.*:ExpertParallel.*:HybridShard.*:ParamOffloadLayouts.*:CollectiveTimeout.*:Bf16Masters.Zero*:Bf16Masters.Offload*:Bf16Masters.HostParameter*:CompactStates.Zero*:CompactStates.EightBitCheckpointFromTwoRanksResumesOnOne*:CompactStates.EightBitDdp*:Families.Zero3MixtralWithAuxLossAndFullRecompute*:Families.MoeRefuses*:Checkpoint.Tp*:Checkpoint.Zero*:Checkpoint.Ddp*:Checkpoint.Pp*:Checkpoint.Blended*:Checkpoint.HybridZero3*:CheckpointReshard.Tp*:CheckpointReshard.Zero*:CheckpointReshard.Dp2ToDp4*:CheckpointReshard.Dp4*:CheckpointReshard.Pp*:CheckpointReshard.ShuffledDp4*:CheckpointReshard.Hybrid*:CheckpointDataWrap.*OnFour:Checkpoint.Cp*:CheckpointReshard.Cp*:CheckpointReshard.*ToCp*:Lora.TensorAndPipeline*:Lora.CheckpointFromPipeline*:Lora.ContextParallel*:Lora.ExpertAdapters*:Lora.Zero3BesideTensorOrPipeline*)
set_tests_properties(mpi_3_ranks PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV};SHARDLM_TEST_FAIL_ON_SKIP=1" TIMEOUT 600
                     RUN_SERIAL TRUE)
# The 3D grid (dp 2 x tp 2 x pp 2) needs 8 ranks; only its tests run there (oversubscribed, 1 thread each):
# the dense grid and the MoE grid with its dp ranks as one expert-parallel group.
add_test(NAME mpi_8_ranks_3d
         COMMAND ${MPIRUN} -n 8 --oversubscribe --bind-to none $<TARGET_FILE:test_mpi>
                 --gtest_filter=Pipeline.ThreeDimensionalGrid*:ExpertParallel.ThreeDimensionalGrid*:ParallelDims.*)
set_tests_properties(mpi_8_ranks_3d PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV}" TIMEOUT 600 RUN_SERIAL TRUE)

# Command-line behaviour (errors, timeouts, end-to-end runs) driven by the pinned environment's python.
file(GLOB cli_tests CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/integration/test_*.py)
# ctest -j (scripts/test.sh) runs tests side by side where that is safe. What each needs:
# - the ones that measure time (timeouts, heartbeats, restarts, signals, bandwidth) run alone
#   (RUN_SERIAL), so that nothing else slows the clock they read;
# - those that read files or start one single-threaded process (OMP_NUM_THREADS=1) at a time take one slot;
# - every other one runs ranks or multi-threaded steps and takes two (on a 2-core machine: alone).
set(cli_tests_timed test_timeout test_all_to_all_timeout test_elastic test_guard test_preemption test_checkpoint
    test_bench_comm)
set(cli_tests_light test_hf_configs test_hf_roundtrip test_prepare_cli test_readme test_structure
    test_tokenizer_json test_tokenizer_real_files test_tokens_32bit test_cli_errors test_prepare_chat test_generate_chat
    test_lora test_moe_roundtrip test_monitors test_plan_lora)
foreach(t ${cli_tests})
  get_filename_component(name ${t} NAME_WE)
  add_test(NAME ${name} COMMAND ${SHARDLM_PYTHON} ${t} $<TARGET_FILE:shardlm>)
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV};SHARDLM_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
                       TIMEOUT 600 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  if(name IN_LIST cli_tests_timed)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  elseif(NOT name IN_LIST cli_tests_light)
    set_tests_properties(${name} PROPERTIES PROCESSORS 2)
  endif()
endforeach()
include(tests/reference/tests.cmake)

# tokenizer.json parity: tests/reference/make_tokenizer_cases.py builds tokenizers with the pinned
# `tokenizers` (and decompresses the public files of tests/data/tokenizers/) and writes their
# golden ids into the build tree; test_data's HfTokenizerParity tests (which require this fixture,
# see the unit-test loop in CMakeLists.txt) compare against them.
set(SHARDLM_TOKENIZER_CASES ${CMAKE_BINARY_DIR}/tokenizer_cases)
add_test(NAME reference_tokenizer_cases
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_tokenizer_cases.py ${SHARDLM_TOKENIZER_CASES}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_tokenizer_cases PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;HF_HUB_OFFLINE=1"
                     TIMEOUT 600 FIXTURES_SETUP tokenizer_cases)
if(TARGET test_data)
  target_compile_definitions(test_data PRIVATE SHARDLM_TOKENIZER_CASES_DIR="${SHARDLM_TOKENIZER_CASES}")
endif()

# Chat templates (issue 41): make_chat_cases.py renders the conversations of its list with every real
# template of tests/data/chat_templates/ through the pinned transformers, each with a small tokenizer
# holding the template's special tokens, and writes ids, texts and loss masks into the build tree.
# It sets up the tokenizer_cases fixture too, so every data test (which requires that one) waits for it;
# test_data's ChatTemplates tests, test_prepare_chat and test_generate_chat read it.
set(SHARDLM_CHAT_CASES ${CMAKE_BINARY_DIR}/chat_cases)
add_test(NAME reference_chat_cases
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_chat_cases.py ${SHARDLM_CHAT_CASES}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_chat_cases PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;HF_HUB_OFFLINE=1"
                     TIMEOUT 600 FIXTURES_SETUP "tokenizer_cases;chat_cases")
if(TARGET test_data)
  target_compile_definitions(test_data PRIVATE SHARDLM_CHAT_CASES_DIR="${SHARDLM_CHAT_CASES}")
endif()
set_tests_properties(test_prepare_chat test_generate_chat PROPERTIES FIXTURES_REQUIRED chat_cases)
