// Folding measured phase times back (planner/calibration.h): the refit reproduces what was
// measured, leaves alone what the plan barely ran, and autotune's rule switches only when the
// refit figures predict enough.
#include "planner/calibration.h"

#include <gtest/gtest.h>

#include <random>

#include "api/error.h"
#include "planner/planner.h"
#include "test_util.h"

namespace kt {
namespace {

std::map<std::string, double> phases(const api::TimeBreakdown& t, double compute, double tp,
                                     double dp) {
  return {{"compute", t.compute * compute},
          {"tp_comm_total", t.tp_comm_total * tp},
          {"dp_comm_total", t.dp_comm_total * dp},
          {"transfer_total", t.transfer_total},
          {"optimizer_cpu_total", t.optimizer_cpu_total}};
}

const api::Node& first_node(const api::Inventory& inv, const api::Plan& plan) {
  for (const api::Node& n : inv.nodes)
    if (n.name == plan.placement[0]) return n;
  throw std::runtime_error("no node");
}

// gpt2-124m at batch 64 on one 8 × H100 node: the built-in figures pick TP 2 × DP 4.
api::TrainingJob gpt2_job(int64_t steps = 100000) {
  return test::gpt_job("{preset: gpt2-124m}", "  training: {steps: " + std::to_string(steps) +
                                                  ", globalBatchSize: 64}\n");
}

// `inv` with the figures of `plan`'s node kind refit by phases `scale`d from its prediction.
api::Inventory refit_by(const api::Inventory& inv, const api::Plan& plan, double compute,
                        double tp, double dp) {
  const planner::Refit r = planner::refit(first_node(inv, plan).hardware, plan.predicted.time,
                                          plan.predicted.step_seconds,
                                          phases(plan.predicted.time, compute, tp, dp));
  api::Inventory refit = inv;
  planner::apply_scales(refit, r.profile);
  return refit;
}

api::Inventory one_h100_node() {
  return test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n- name: dgx\n  gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n"
      "  cpu: {cores: 112}\n  memory: 2Ti\n");
}

TEST(Calibration, RefitReproducesTheMeasuredPhases_OnFreshRandomSlowdowns) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> factor(0.4, 4.0);
  const api::TrainingJob job = gpt2_job();
  api::Inventory inv = one_h100_node();
  const api::Plan plan = planner::best_plan(job, inv);
  ASSERT_GT(plan.config.tp, 1);
  ASSERT_GT(plan.config.dp, 1);
  for (int trial = 0; trial < 5; ++trial) {
    const double fc = factor(rng), ft = factor(rng), fd = factor(rng);
    SCOPED_TRACE(testing::Message() << "compute ×" << fc << ", TP ×" << ft << ", DP ×" << fd);
    const planner::Refit r =
        planner::refit(first_node(inv, plan).hardware, plan.predicted.time,
                       plan.predicted.step_seconds, phases(plan.predicted.time, fc, ft, fd));
    EXPECT_NEAR(r.profile.compute_scale, fc, 1e-9);
    EXPECT_NEAR(r.profile.tp_comm_scale, ft, 1e-9);
    EXPECT_NEAR(r.profile.dp_comm_scale, fd, 1e-9);
    EXPECT_EQ(r.changes.size(), 3u);
    // The same configuration predicted again with the refit: the measured phase times.
    api::Inventory refit = inv;
    EXPECT_EQ(planner::apply_scales(refit, r.profile), 1);
    const auto again = planner::predict_again(job, plan, refit);
    ASSERT_TRUE(again);
    EXPECT_EQ(again->config, plan.config);
    EXPECT_NEAR(again->predicted.time.compute, plan.predicted.time.compute * fc,
                1e-9 * plan.predicted.time.compute * fc);
    EXPECT_NEAR(again->predicted.time.tp_comm_total, plan.predicted.time.tp_comm_total * ft,
                1e-9 * plan.predicted.time.tp_comm_total * ft);
    EXPECT_NEAR(again->predicted.time.dp_comm_total, plan.predicted.time.dp_comm_total * fd,
                1e-9 * plan.predicted.time.dp_comm_total * fd);
  }
}

TEST(Calibration, PhasesThePlanBarelyRuns_KeepTheirScale_AndScalesAreBounded) {
  const api::TrainingJob job = gpt2_job();
  api::Inventory inv = one_h100_node();
  const api::Plan plan = planner::best_plan(job, inv);
  api::HardwareProfile hw = first_node(inv, plan).hardware;
  hw.transfer_scale = 1.7;  // folded back before, from a plan with offload
  std::map<std::string, double> measured = phases(plan.predicted.time, 1000, 1, 1);
  measured["transfer_total"] = 5.0;  // predicted 0: says nothing about the copies
  measured["dp_comm_total"] = -1;    // nonsense is ignored
  const planner::Refit r =
      planner::refit(hw, plan.predicted.time, plan.predicted.step_seconds, measured);
  EXPECT_DOUBLE_EQ(r.profile.transfer_scale, 1.7);
  EXPECT_DOUBLE_EQ(r.profile.dp_comm_scale, 1.0);
  EXPECT_DOUBLE_EQ(r.profile.compute_scale, planner::kMaxScale);
}

TEST(Calibration, AHiddenCollectivesExposedPart_IsTheEvidence_ItsInflatedTotalIsNot) {
  // An overlapped TP plan whose all-reduces ran 6x longer in total (slowed by the compute they
  // hid behind) but left 3x the predicted time exposed: the step grew by the exposed part.
  const api::TrainingJob job = gpt2_job();
  api::Inventory inv = one_h100_node();
  const api::Plan plan = planner::best_plan(job, inv);
  ASSERT_EQ(plan.config.sub_batches, 2);
  const double floor = planner::kMinPhaseShare * plan.predicted.step_seconds;
  ASSERT_GE(plan.predicted.time.tp_comm_exposed, std::max(planner::kMinPhaseSeconds, floor));
  std::map<std::string, double> measured = phases(plan.predicted.time, 1, 6, 1);
  measured["tp_comm_exposed"] = 3 * plan.predicted.time.tp_comm_exposed;
  const planner::Refit r = planner::refit(first_node(inv, plan).hardware, plan.predicted.time,
                                          plan.predicted.step_seconds, measured);
  EXPECT_NEAR(r.profile.tp_comm_scale, 3.0, 1e-9);
  // Without an exposed measurement the total is all there is.
  measured.erase("tp_comm_exposed");
  EXPECT_NEAR(planner::refit(first_node(inv, plan).hardware, plan.predicted.time,
                             plan.predicted.step_seconds, measured)
                  .profile.tp_comm_scale,
              6.0, 1e-9);
}

TEST(Calibration, Decide_SwitchesOnlyWhenTheRefitPredictsEnough_AndTheRestRepaysIt) {
  const api::TrainingJob job = gpt2_job();
  api::Inventory inv = one_h100_node();
  const api::Plan plan = planner::best_plan(job, inv);
  // Measured as predicted: the running plan is the best; nothing to do.
  {
    const auto d = planner::decide(job, plan, refit_by(inv, plan, 1, 1, 1), 100000, 0);
    EXPECT_FALSE(d.switch_plan) << d.reason;
    ASSERT_TRUE(d.best);
    EXPECT_EQ(d.best->config, plan.config);
  }
  // TP all-reduces 6× dearer: a plan with less TP, switched to, predicted >= 10% faster.
  const api::Inventory refit = refit_by(inv, plan, 1, 6, 1);
  const auto d = planner::decide(job, plan, refit, 100000, 0);
  ASSERT_TRUE(d.switch_plan) << d.reason;
  EXPECT_LT(d.best->config.tp, plan.config.tp);
  EXPECT_GE(d.best->predicted.tokens_per_second, 1.1 * d.current->predicted.tokens_per_second);
  // ... but not for 10 steps left against a 120 s restart, nor for a gain asked above it.
  EXPECT_FALSE(planner::decide(job, plan, refit, 10, 120).switch_plan);
  const double gain =
      d.best->predicted.tokens_per_second / d.current->predicted.tokens_per_second - 1;
  EXPECT_FALSE(planner::decide(job, plan, refit, 100000, 0, gain + 0.01).switch_plan);
}

TEST(Planner, MinNodes_IsTheFewestNodesAPlanUses_AndMoreThanAreUsableSaysSo) {
  const auto inv = test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n- name: dgx\n  replicas: 4\n"
      "  gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n  cpu: {cores: 112}\n  memory: 2Ti\n");
  const auto job = [](const std::string& resources) {
    return test::gpt_job("{preset: gpt2-124m}",
                         "  training: {steps: 10, globalBatchSize: 64}\n  resources: " +
                             resources + "\n");
  };
  const api::Plan free = planner::best_plan(job("{}"), inv);
  const api::Plan three = planner::best_plan(job("{minNodes: 3}"), inv);
  EXPECT_GE(three.config.nodes, 3);
  EXPECT_GE(free.config.nodes, 1);
  EXPECT_EQ(planner::best_plan(job("{minNodes: 2, maxNodes: 2}"), inv).config.nodes, 2);
  try {
    planner::best_plan(job("{minNodes: 5}"), inv);
    FAIL() << "planned on fewer than minNodes";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.path(), "spec.resources.minNodes");
    EXPECT_NE(std::string(e.what()).find("is 5 but 4 schedulable node(s)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kt
