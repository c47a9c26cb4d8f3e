// One function per subcommand; each lives in its own cli/cmd_<name>.cpp and receives argv starting
// at the command name. They return the process exit code and throw shardlm::Error on bad input.
#pragma once

namespace shardlm::cli {
int run_train(int argc, char** argv);
int run_prepare(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_export(int argc, char** argv);
int run_plan(int argc, char** argv);
int run_report(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_diagnose(int argc, char** argv);  // merge the ranks' flight records, name the first disagreement
int run_version(int argc, char** argv);  // also `shardlm --version`
int run_config_keys(int argc, char** argv);  // the training config key table
}  // namespace shardlm::cli
