// The tepdist command line: builds the components each subcommand needs and hands them down.

#include <CLI/App.hpp>
#include <CLI/Config.hpp>
#include <CLI/Formatter.hpp>
#include <fmt/core.h>

#include "cli/train_command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tepdist: actor-based, elastic, peer-to-peer training engine", "tepdist"};
  app.set_version_flag("--version", "tepdist 0.1.0");
  app.require_subcommand(1);

  tepdist::cli::TrainArgs train;
  auto* cmd = app.add_subcommand("train", "Train a model in this process (mode single)");
  cmd->add_option("config", train.config, "Job file (TOML); without one, the built-in defaults")
      ->check(CLI::ExistingFile);
  cmd->add_option("--epochs", train.epochs, "Override job.epochs")->check(CLI::Range(1, 10000));
  cmd->add_option("--threads", train.threads, "Override compute.threads (0: every core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--set", train.overrides, "Override a key: --set section.key=value (repeatable)");
  cmd->add_option("--out", train.out, "Directory for result.json, model.safetensors and checkpoint")
      ->capture_default_str();
  cmd->add_flag("--resume", train.resume, "Continue from OUT/checkpoint");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cmd->parsed()) return tepdist::cli::run_train(train);
  return 2;
}
