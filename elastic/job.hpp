#pragma once
// What every training subcommand builds from a job file the same way: the data sets and the model.
// `tepdist train` and every node of `tepdist run` call these, so a replica on any node starts from
// the very parameters a single process would (same preset or layers, same seed).

#include <functional>
#include <memory>

#include "compute/backends.hpp"
#include "compute/data/dataset.hpp"
#include "compute/model.hpp"
#include "elastic/config.hpp"

namespace tepdist::elastic {

struct JobData {
  compute::Dataset train, test;
};

/// The [data] section's training and test sets (synthetic: one generator call split in two, so
/// both share the class patterns), checked whole: a label outside the training set's classes, a
/// value that is not finite, is refused here, naming the file.
compute::Result<JobData> load_job_data(const JobConfig::Data& data, uint64_t seed);

/// The model class of the running program (`model.preset = "program"`): tepdist::Trainer registers
/// it in the program and in every node process it starts from it. The factory returns the model
/// unbuilt; build_job_model builds it from the job seed.
using ModelFactory = std::function<std::unique_ptr<compute::Model>()>;
void set_program_model(ModelFactory factory);

/// The [model] section's network, built for the data's samples and checked against its classes,
/// then loaded from model.init_file if one is named; errors name the config source.
compute::Result<std::unique_ptr<compute::Model>> build_job_model(const JobConfig& config, const compute::Dataset& train);

/// The [compute] section's options for make_backend (device, deterministic).
compute::BackendOptions backend_options(const JobConfig& config);

}  // namespace tepdist::elastic
