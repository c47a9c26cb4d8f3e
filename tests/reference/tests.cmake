# The Python reference behind tests/golden/: the goldens are what make_golden.py writes (byte for byte),
# the transcription hf_llama.py passes its sanity checks, and it agrees with transformers' LlamaForCausalLM.
# Included from tests/tests.cmake; SHARDLM_PYTHON is the pinned virtual environment's python.
set(SHARDLM_REFERENCE_ENV "OMP_NUM_THREADS=1;HF_HUB_OFFLINE=1;TRANSFORMERS_OFFLINE=1")

add_test(NAME reference_golden_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME reference_self_checks
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/check_reference.py
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME reference_transformers_parity
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/check_transformers.py
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# bf16 master weights (tests/golden/bf16_masters.safetensors, read by test_optim's Bf16Masters tests):
# what make_bf16_master_golden.py writes from numpy's float32 update and torchao's own stochastic rounding.
add_test(NAME reference_bf16_masters_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_bf16_master_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# DeepSpeed's CPU Adam over bf16 masters (tests/golden/deepspeed_cpu_adam.safetensors, read by test_optim's
# DeepSpeedCpuAdam tests): what make_deepspeed_cpu_adam_golden.py writes, a numpy float32 transcript of
# DeepSpeed 0.19.8's cpu_adam_impl.cpp Step_1.
add_test(NAME reference_deepspeed_cpu_adam_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_deepspeed_cpu_adam_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# DeepSpeed's optimizer types (tests/golden/deepspeed_optim.json, read by test_optim's DeepSpeed tests): the
# steps recomputed from the inputs the file stores (the schedulers of deepspeed_lr.json need DeepSpeed).
add_test(NAME reference_deepspeed_optim_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_deepspeed_goldens.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# TensorBoard event records (tests/golden/tensorboard_events.bin, read by test_observe's TensorBoardEncoder
# tests): what make_tensorboard_golden.py writes with the pinned tensorboard package's own RecordWriter.
add_test(NAME reference_tensorboard_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_tensorboard_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# The config.json keys the pinned transformers reads per model type (src/model/hf_transformers_reads.cpp,
# which decides between "ignored, named" and "refused" for a key shardlm's table lacks): regenerated
# from transformers' source and compared with the committed file.
add_test(NAME reference_hf_config_reads_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_hf_config_reads.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# QLoRA's 4-bit base (tests/golden/4bit.safetensors, read by test_model's FourBit tests): what the pinned
# bitsandbytes' CPU quantize_4bit / dequantize_4bit return for the inputs the file stores.
add_test(NAME reference_4bit_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_4bit_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# QLoRA against PEFT + bitsandbytes (tests/golden/qlora.safetensors, read by test_model's QloraParity
# tests): the LoRA golden's model loaded 4-bit by the pinned transformers, with PEFT's adapters.
add_test(NAME reference_qlora_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_qlora_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})

# Every *_check above reads the inputs of its golden from the committed file and recomputes only the
# outputs: drawing the inputs again (torch.randn, torch.exp) rounds differently from one CPU to another.
set_tests_properties(reference_golden_check reference_self_checks reference_transformers_parity
                     reference_bf16_masters_check reference_deepspeed_cpu_adam_check reference_deepspeed_optim_check
                     reference_tensorboard_check reference_hf_config_reads_check reference_4bit_check
                     reference_qlora_check
                     PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600)

# Llama-family parity cases made by transformers itself (a rope type, head_dim, biases, windows, a
# 128k vocabulary), written into the build tree at test time: the fixture of the family tests.
set(SHARDLM_FAMILY_CASES ${CMAKE_BINARY_DIR}/family_cases)
add_test(NAME reference_family_cases
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_family_cases.py ${SHARDLM_FAMILY_CASES}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_family_cases PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600
                     FIXTURES_SETUP family_cases)
add_executable(test_family ${CMAKE_SOURCE_DIR}/tests/family/test_family_parity.cpp)
target_link_libraries(test_family PRIVATE shardlm_train GTest::gtest GTest::gtest_main)
target_compile_options(test_family PRIVATE ${SHARDLM_WARNINGS})
target_precompile_headers(test_family REUSE_FROM shardlm_pch)
target_compile_definitions(test_family PRIVATE SHARDLM_FAMILY_CASES_DIR="${SHARDLM_FAMILY_CASES}")
add_test(NAME family_parity COMMAND test_family)  # one entry, as the unit tests (CMakeLists.txt)
set_tests_properties(family_parity PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 600 FIXTURES_REQUIRED family_cases)

# Masked fine-tuning (prepare --sft, padded and packed rows, global-batch loss normalisation):
# make_sft_cases.py prepares the data with the shardlm binary, trains transformers (fp32) and
# hf_llama.py (fp64) 3 steps on it, and writes the references into the build tree; test_sft runs the
# trainer on the same data under mpirun -n 2 in several layouts and compares (tests/sft/), and again
# on 1 rank in the layouts one rank holds (one process, one thread: one slot).
set(SHARDLM_SFT_CASES ${CMAKE_BINARY_DIR}/sft_cases)
add_test(NAME reference_sft_cases
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_sft_cases.py ${SHARDLM_SFT_CASES}
                 $<TARGET_FILE:shardlm>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_sft_cases PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600
                     FIXTURES_SETUP sft_cases)
add_executable(test_sft ${CMAKE_SOURCE_DIR}/tests/sft/test_sft_parity.cpp ${CMAKE_SOURCE_DIR}/tests/mpi/mpi_main.cpp)
target_link_libraries(test_sft PRIVATE shardlm_train GTest::gtest)
target_compile_options(test_sft PRIVATE ${SHARDLM_WARNINGS})
target_precompile_headers(test_sft REUSE_FROM shardlm_pch)
target_compile_definitions(test_sft PRIVATE SHARDLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                           SHARDLM_SFT_CASES_DIR="${SHARDLM_SFT_CASES}")
add_test(NAME sft_parity_2_ranks COMMAND ${MPIRUN} -n 2 --oversubscribe --bind-to none $<TARGET_FILE:test_sft>)
set_tests_properties(sft_parity_2_ranks PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV}" TIMEOUT 600 PROCESSORS 2
                     FIXTURES_REQUIRED sft_cases)
add_test(NAME sft_parity_1_rank COMMAND ${MPIRUN} -n 1 --bind-to none $<TARGET_FILE:test_sft>
                                        --gtest_filter=-SftParity.PackedTensor*)
set_tests_properties(sft_parity_1_rank PROPERTIES ENVIRONMENT "${SHARDLM_TEST_ENV};SHARDLM_TEST_FAIL_ON_SKIP=1"
                     TIMEOUT 600 FIXTURES_REQUIRED sft_cases)

# The chat-template engine's golden (tests/golden/jinja_cases.json, read by test_data's JinjaGolden
# tests): what make_jinja_cases.py renders with the pinned jinja2 in transformers' own environment.
add_test(NAME reference_jinja_cases_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_jinja_cases.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_jinja_cases_check PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600)

# LoRA against PEFT (tests/golden/lora/, read by test_train's LoraParity tests; lora_mixtral/ and
# lora_qwen2_moe/, the experts' adapters through target_parameters, read by its MoeLoraParity tests): the
# pinned transformers and peft load the committed tiny bases and adapters and train the 3 AdamW steps
# again in float64, compared with the committed outputs (the inputs are read, never redrawn).
add_test(NAME reference_lora_check
         COMMAND ${SHARDLM_PYTHON} ${CMAKE_SOURCE_DIR}/tests/reference/make_lora_golden.py --check
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(reference_lora_check PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600)
