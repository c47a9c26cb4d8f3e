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

set_tests_properties(reference_golden_check reference_self_checks reference_transformers_parity
                     PROPERTIES ENVIRONMENT "${SHARDLM_REFERENCE_ENV}" TIMEOUT 600)
