// The tepdist command line: builds the components each subcommand needs and hands them down.

#include <CLI/App.hpp>
#include <CLI/Config.hpp>
#include <CLI/Formatter.hpp>
#include <fmt/core.h>

#include "actors/launcher.hpp"
#include "cli/export_command.hpp"
#include "cli/leave_command.hpp"
#include "cli/run_command.hpp"
#include "cli/sim_command.hpp"
#include "cli/status_command.hpp"
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

  tepdist::cli::RunArgs run;
  auto* run_cmd = app.add_subcommand("run", "Train on a cluster: start local nodes (or join one) and run the job");
  run_cmd->add_option("config", run.config, "Job file (TOML); without one, the built-in configs/quickstart.toml")
      ->check(CLI::ExistingFile);
  run_cmd->add_option("--nodes", run.nodes, "Override cluster.local_nodes")->check(CLI::Range(1, 64));
  run_cmd->add_option("--mode", run.mode, "Override job.mode");
  run_cmd->add_option("--epochs", run.epochs, "Override job.epochs")->check(CLI::Range(1, 10000));
  run_cmd->add_option("--set", run.overrides, "Override a key: --set section.key=value (repeatable)");
  run_cmd->add_option("--listen", run.listen,
                      "HOST:PORT this process listens on as the cluster's submitter; with seeds on other machines, an "
                      "address they can reach")
      ->capture_default_str();
  run_cmd->add_flag("--detach", run.detach,
                    "With seeds (no local nodes): exit once the job trains; it goes on, and rank 0 saves the "
                    "result on its node ([cluster] results_dir)");
  run_cmd->add_option("--out", run.out, "Directory for result.json, model.safetensors, cluster.toml and logs/")
      ->capture_default_str();
  run_cmd->add_flag("--resume", run.resume,
                    "Continue the job from the newest checkpoint in [elastic] checkpoint_dir (default OUT/checkpoints), "
                    "on any number of nodes, in every mode");

  tepdist::actors::NodeProcessArgs node;
  auto* node_cmd = app.add_subcommand("node", "Run one node of a cluster until SIGTERM or SIGINT");
  node_cmd->add_option("config", node.config, "Job file (TOML) with [cluster] and [network]")->check(CLI::ExistingFile);
  node_cmd->add_option("--set", node.overrides, "Override a key: --set section.key=value (repeatable)");
  node_cmd->add_option("--listen", node.listen, "HOST:PORT to accept peers on (port 0: any free port)")
      ->capture_default_str();
  node_cmd->add_option("--join", node.join, "HOST:PORT of a member to join through (repeatable)");
  node_cmd->add_option("--name", node.name, "Node id (default: the bound host:port)");
  node_cmd->add_option("--region", node.region, "Region for the link emulator (default: local)");
  node_cmd->add_option("--ready-file", node.ready_file, "Write the bound HOST:PORT here once listening");

  tepdist::cli::StatusArgs status;
  auto* status_cmd = app.add_subcommand("status", "Print the cluster as one member sees it");
  status_cmd->add_option("config", status.config, "Job file (TOML) with the [cluster] secret")->check(CLI::ExistingFile);
  status_cmd->add_option("--set", status.overrides, "Override a key: --set section.key=value (repeatable)");
  status_cmd->add_option("--peer", status.peer, "HOST:PORT of a member to ask")->required();
  status_cmd->add_flag("--json", status.json, "Print JSON instead of a table");
  status_cmd->add_option("--watch", status.watch_s, "Ask again every SECONDS until interrupted (Ctrl-C)")
      ->expected(0, 1)
      ->default_str("2")
      ->check(CLI::Range(0.1, 3600.0));

  tepdist::cli::LeaveArgs leave;
  auto* leave_cmd = app.add_subcommand("leave", "Ask a node to drain (finish its step) and leave the cluster");
  leave_cmd->add_option("node", leave.node, "Id of the node to leave (its --name)")->required();
  leave_cmd->add_option("config", leave.config, "Job file (TOML) with the [cluster] secret")->check(CLI::ExistingFile);
  leave_cmd->add_option("--set", leave.overrides, "Override a key: --set section.key=value (repeatable)");
  leave_cmd->add_option("--peer", leave.peer, "HOST:PORT of any member, to find the node by")->required();

  tepdist::cli::SimArgs sim;
  auto* sim_cmd = app.add_subcommand("sim", "Run a scenario in the deterministic membership simulator");
  sim_cmd->add_option("scenario", sim.scenario, "Scenario file (sims/scenarios/*.toml)")->required()->check(CLI::ExistingFile);
  sim_cmd->add_option("--seed", sim.seed, "Seed of the run (default 1); the same seed replays it exactly");
  sim_cmd->add_flag("--json", sim.json, "Print the report as JSON");

  tepdist::cli::ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "Write the model of a checkpoint as a .safetensors file");
  export_cmd->add_option("checkpoint", export_args.checkpoint,
                         "A folder of cluster checkpoints (the newest that checks out) or one checkpoint file")
      ->required()
      ->check(CLI::ExistingPath);
  export_cmd->add_option("--out", export_args.out, "The .safetensors file to write")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (cmd->parsed()) return tepdist::cli::run_train(train);
  if (run_cmd->parsed()) return tepdist::cli::run_run_command(run);
  if (node_cmd->parsed()) return tepdist::actors::run_node_process(node);
  if (status_cmd->parsed()) return tepdist::cli::run_status_command(status);
  if (leave_cmd->parsed()) return tepdist::cli::run_leave_command(leave);
  if (sim_cmd->parsed()) return tepdist::cli::run_sim_command(sim);
  if (export_cmd->parsed()) return tepdist::cli::run_export_command(export_args);
  return 2;
}
