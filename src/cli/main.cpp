// shardlm command-line entry point: dispatches `shardlm <command> ...` to one file per command.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "cli/error_text.h"
#include "util/error.h"

namespace {
void usage() {
  std::printf(
      "shardlm — memory-efficient distributed training of Llama models\n\n"
      "usage: shardlm <command> [options]\n\n"
      "commands:\n"
      "  train     train a model:   shardlm train --config FILE [--nproc N] [--section.key=value ...]\n"
      "  prepare   tokenize text into train/val token files\n"
      "  generate  sample text from a trained model\n"
      "  export    write a Hugging Face directory (config.json + model.safetensors) from a run\n"
      "  plan      predict memory and communication per rank and recommend a strategy\n"
      "  report    write a self-contained HTML report of a run directory\n"
      "  bench     measure the machine: shardlm bench comm (collectives vs memcpy bandwidth)\n"
      "  diagnose  explain a hang or crash from the ranks' flight records: shardlm diagnose RUN_DIR\n"
      "  version   shardlm, libtorch, CUDA, NCCL and MPI versions (also --version)\n"
      "  config-keys  every training config key: type, default, allowed values, meaning (--markdown)\n\n"
      "run `shardlm <command> --help` for a command's options\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = !std::strcmp(argv[1], "--version") ? "version" : argv[1];
  try {
    if (cmd == "train") return shardlm::cli::run_train(argc - 1, argv + 1);
    if (cmd == "prepare") return shardlm::cli::run_prepare(argc - 1, argv + 1);
    if (cmd == "generate") return shardlm::cli::run_generate(argc - 1, argv + 1);
    if (cmd == "export") return shardlm::cli::run_export(argc - 1, argv + 1);
    if (cmd == "plan") return shardlm::cli::run_plan(argc - 1, argv + 1);
    if (cmd == "report") return shardlm::cli::run_report(argc - 1, argv + 1);
    if (cmd == "bench") return shardlm::cli::run_bench(argc - 1, argv + 1);
    if (cmd == "diagnose") return shardlm::cli::run_diagnose(argc - 1, argv + 1);
    if (cmd == "version") return shardlm::cli::run_version(argc - 1, argv + 1);
    if (cmd == "config-keys") return shardlm::cli::run_config_keys(argc - 1, argv + 1);
  } catch (const shardlm::Error& e) {
    std::fprintf(stderr, "shardlm %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {  // out of memory, filesystem, library errors (cli/error_text.h)
    const auto text = shardlm::cli::describe_error(e);
    std::fprintf(stderr, "shardlm %s: %s: %s\n", cmd.c_str(), text.internal ? "internal error" : "error", text.message.c_str());
    return 1;
  }
  std::fprintf(stderr, "shardlm: unknown command '%s'. Commands: train, prepare, generate, export, plan, report, bench, diagnose, version, config-keys.\n", cmd.c_str());
  return 2;
}
