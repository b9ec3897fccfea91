#include "actors/roles/trainer/job.hpp"

#include "base/thread_name.hpp"

namespace tepdist::actors::trainer_detail {

namespace {

/// What rank 0's evaluator needs: its own model (parameters are copied in), backend and test set.
struct EvalKit {
  std::unique_ptr<compute::Model> model;
  std::unique_ptr<compute::Backend> backend;
  compute::Dataset test;
  uint64_t job_id = 0;
  int threads = 0;  // [compute] threads: set on the evaluator's own thread
};

/// Evaluates parameter snapshots: (eval_atom, parameters) -> (accuracy, loss, seconds), or a
/// runtime_error holding the refusal's message (a test set the model does not take: a label
/// outside its classes, a sample of another shape).
caf::behavior evaluator(caf::event_based_actor*, std::shared_ptr<EvalKit> kit) {
  base::name_this_thread("evaluator");  // detached: this is its own thread
  // Its own thread, so its own team size: left alone, it computed with every core beside a
  // trainer given one (on a core shared with it, 5 s an evaluation where 0.3 s would do).
  kit->backend->set_threads(kit->threads);
  node_events().info("evaluator_started job={} threads={}", kit->job_id, kit->backend->threads_here());
  return {[kit](eval_atom, const std::vector<float>& params) -> caf::result<double, double, double> {
    const auto t0 = Clock::now();
    std::copy(params.begin(), params.end(), kit->model->parameters().begin());
    const auto e = compute::try_evaluate(*kit->model, *kit->backend, kit->test);
    if (!e) return caf::make_error(caf::sec::runtime_error, e.error().message);
    return {e->accuracy, e->loss, seconds_between(t0, Clock::now())};
  }};
}

/// Why an evaluation failed: the evaluator's own refusal as it said it, anything else (the
/// evaluator gone, say) as CAF renders it.
std::string reason_of(caf::actor_system& system, const caf::error& e) {
  const auto& context = e.context();
  if (e.category() == caf::atom("system") && e.code() == static_cast<uint8_t>(caf::sec::runtime_error) &&
      context.match_elements<std::string>())
    return context.get_as<std::string>(0);
  return system.render(e);
}

}  // namespace

void stop_training(Trainer*, Job& j) {
  if (j.step >= j.total_steps) return;
  node_events().info("stop_at_target job={} rank={} step={} of={}", j.start.job_id, j.rank, j.step, j.total_steps);
  j.total_steps = j.step;
}

void tell_target_reached(Trainer* self, Job& j) {
  auto& s = self->state;
  for (size_t i = 1; i < j.start.addresses.size(); ++i)
    send_to(self, j.start.addresses[i],
            gossip::Control{s.o.self_id, s.o.incarnation, gossip::Control::Command::target_reached, j.start.job_id, {}});
}

bool take_target_reached(Trainer* self, Job& j, const std::string& peer, const gossip::Control& c) {
  if (c.command != gossip::Control::Command::target_reached || j.rank == 0 || peer != j.start.workers[0]) return false;
  stop_training(self, j);
  // A worker waiting on nothing (none of its steps under way) takes the end now.
  self->send(self, step_atom::value);
  return true;
}

void evaluate_snapshot(Trainer* self) {
  auto& j = *self->state.job;
  if (j.last_eval_step == j.step) return;
  j.last_eval_step = j.step;
  if (j.pending_evals++ == 0) {
    auto& load = j.eval_load;
    load.began = Clock::now();
    load.began_samples = j.own_samples;
    load.began_speed = j.speed.speed();  // the steps before it, which it did not slow
  }
  parameters_to_host(j);
  const auto params = j.model->parameters();
  JobReport r = report_of(j, JobReport::Kind::evaluation);
  const uint64_t job_id = j.start.job_id;
  self->request(j.evaluator, caf::infinite, eval_atom::value, std::vector<float>(params.begin(), params.end()))
      .then([self, r, job_id](double accuracy, double loss, double seconds) mutable {
        auto& job = self->state.job;
        if (!job || job->start.job_id != job_id) return;
        if (--job->pending_evals == 0) {
          auto& load = job->eval_load;
          const double took = seconds_between(load.began, Clock::now());
          const uint64_t trained = job->own_samples - load.began_samples;
          load.busy_s += took;
          load.busy_samples += trained;
          if (load.began_speed > 0)
            load.cost_s = std::max(0.0, took - static_cast<double>(trained) / load.began_speed);
        }
        job->last_accuracy = r.test_accuracy = accuracy;
        job->last_test_loss = r.test_loss = loss;
        job->eval_seconds += seconds;
        job->evaluations.push_back({r.step, r.epoch, r.train_seconds, accuracy, loss});
        while (job->evaluations.size() > Job::evaluation_points) job->evaluations.pop_front();
        // A plateau: rank 0 decides the decay; the next generation carries it to every worker.
        if (job->plateau && job->control && !job->finishing)
          if (const auto factor = job->plateau->on_evaluation(loss, job->decided_factor)) {
            job->decided_factor = *factor;
            job->control->set_rate_factor(*factor);
            node_events().info("plateau_decay job={} step={} test_loss={:.4f} factor={:.4g}", job_id, job->step, loss,
                               *factor);
          }
        // Sync votes to stop in the next ring; async and gossip tell the workers (Driver::on_target).
        const bool reached = job->config.job.stop_at_target && accuracy >= job->config.job.target_accuracy;
        if (reached && !job->target_reached) {
          job->target_reached = true;
          job->driver->on_target(self, *job);
          if (!self->state.job) return;
        }
        r.eval_seconds = seconds;
        to_submitter(self, *job, r);
        if (job->finishing && job->pending_evals == 0) complete_rank0(self);
        else if (job->held && !job->held_reported && job->rank == 0 && job->pending_evals == 0) report_held(self);
      },
      [self, job_id](const caf::error& e) {
        auto& job = self->state.job;
        if (job && job->start.job_id == job_id) fail_everywhere(self, "evaluation failed: " + reason_of(self->system(), e));
      });
}

std::expected<void, std::string> ensure_evaluator(Trainer* self, Job& j) {
  if (j.evaluator) return {};
  auto kit = std::make_shared<EvalKit>();
  auto eval_model = elastic::build_job_model(j.config, j.data.train);
  auto eval_backend = compute::make_backend(j.config.compute.backend, elastic::backend_options(j.config));
  if (!eval_model || !eval_backend) return std::unexpected(std::string("cannot build the evaluator's model"));
  kit->model = std::move(*eval_model);
  kit->backend = std::move(*eval_backend);
  kit->threads = static_cast<int>(j.config.compute.threads);
  kit->job_id = j.start.job_id;
  kit->test = j.data.test;
  j.evaluator = self->spawn<caf::detached>(evaluator, kit);
  // Should the trainer itself end (node stopping, role failure), the evaluator ends with it.
  self->attach_functor([evaluator = caf::actor_cast<caf::weak_actor_ptr>(j.evaluator)](const caf::error&) {
    if (auto e = caf::actor_cast<caf::actor>(evaluator)) caf::anon_send_exit(e, caf::exit_reason::kill);
  });
  return {};
}
}  // namespace tepdist::actors::trainer_detail
