// merge_expositions: several ranks' /metrics texts become one valid exposition.
#include "telemetry/merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "telemetry/metrics.h"
#include "telemetry/worker_metrics.h"

namespace kt {
namespace {

using telemetry::merge_expositions;

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  return lines;
}

// What three worker ranks of one pod serve: the same families, each with its rank label.
std::vector<std::string> three_ranks() {
  std::vector<std::string> texts;
  for (int rank = 0; rank < 3; ++rank) {
    telemetry::Registry registry(telemetry::worker_labels("gpt", "ml", rank, 0));
    telemetry::WorkerMetrics metrics(registry);
    metrics.steps.inc(10 + rank);
    metrics.step_seconds.observe(0.5 + rank);
    metrics.loss.set(2.5);
    metrics.memory_bytes.with({"cpu", "params"}).set(1e6);
    metrics.comm_seconds.with({"tp"}).inc(0.25);
    texts.push_back(registry.expose());
  }
  return texts;
}

TEST(MergeExpositions, OneHelpAndTypePerFamilyWithEveryRanksSamples) {
  const auto texts = three_ranks();
  const std::string merged = merge_expositions(texts);
  EXPECT_EQ(count_of(merged, "# HELP kubetrain_worker_steps_total "), 1);
  EXPECT_EQ(count_of(merged, "# TYPE kubetrain_worker_steps_total counter\n"), 1);
  EXPECT_EQ(count_of(merged, "# TYPE kubetrain_worker_step_seconds histogram\n"), 1);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = "rank=\"" + std::to_string(rank) + "\"";
    EXPECT_NE(merged.find("kubetrain_worker_steps_total{trainingjob=\"gpt\",namespace=\"ml\"," + r +
                          ",node_rank=\"0\"} " + std::to_string(10 + rank)),
              std::string::npos)
        << merged;
  }
  // Nothing lost or invented: every sample line of every rank appears exactly once.
  size_t sample_lines = 0;
  for (const auto& text : texts)
    for (const auto& line : lines_of(text))
      if (!line.empty() && line[0] != '#') {
        ++sample_lines;
        EXPECT_EQ(count_of(merged, line + "\n"), 1) << line;
      }
  size_t merged_samples = 0;
  for (const auto& line : lines_of(merged))
    if (line[0] != '#') ++merged_samples;
  EXPECT_EQ(merged_samples, sample_lines);
}

TEST(MergeExpositions, FamiliesAreSortedAndContiguousWithHistogramPartsInTheirBase) {
  const std::string merged = merge_expositions(three_ranks());
  std::vector<std::string> family_order;
  std::string current;
  for (const auto& line : lines_of(merged)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      family_order.push_back(current);
      continue;
    }
    if (line[0] == '#') continue;
    // Every sample is under the TYPE of its family: its name is the family's, or the
    // family's plus a histogram suffix.
    const std::string name = line.substr(0, line.find_first_of("{ "));
    const bool belongs = name == current || name == current + "_bucket" ||
                         name == current + "_sum" || name == current + "_count";
    EXPECT_TRUE(belongs) << name << " under " << current;
  }
  EXPECT_TRUE(std::is_sorted(family_order.begin(), family_order.end()));
  EXPECT_EQ(std::set<std::string>(family_order.begin(), family_order.end()).size(),
            family_order.size());
}

TEST(MergeExpositions, UntypedSamplesSummariesAndRepeatedSeries) {
  const std::string a =
      "# HELP rpc_seconds RPC latency.\n"
      "# TYPE rpc_seconds summary\n"
      "rpc_seconds{quantile=\"0.5\",rank=\"0\"} 0.1\n"
      "rpc_seconds_sum{rank=\"0\"} 3\n"
      "rpc_seconds_count{rank=\"0\"} 30\n"
      "# a free comment\n"
      "loose_metric{rank=\"0\",path=\"a b}\"} 1\n";
  const std::string b =
      "# TYPE rpc_seconds summary\n"
      "rpc_seconds_sum{rank=\"1\"} 4\r\n"
      "rpc_seconds_count{rank=\"1\"} 40\n"
      "loose_metric{rank=\"0\",path=\"a b}\"} 1\n";  // same series as in `a`: dropped
  EXPECT_EQ(merge_expositions({a, b}),
            "# TYPE loose_metric untyped\n"
            "loose_metric{rank=\"0\",path=\"a b}\"} 1\n"
            "# HELP rpc_seconds RPC latency.\n"
            "# TYPE rpc_seconds summary\n"
            "rpc_seconds{quantile=\"0.5\",rank=\"0\"} 0.1\n"
            "rpc_seconds_sum{rank=\"0\"} 3\n"
            "rpc_seconds_count{rank=\"0\"} 30\n"
            "rpc_seconds_sum{rank=\"1\"} 4\n"
            "rpc_seconds_count{rank=\"1\"} 40\n");
  EXPECT_EQ(merge_expositions({}), "");
}

TEST(MergeExpositions, PassesPromtoolCheckMetrics) {
  // CI installs Debian's prometheus package; without promtool this check cannot be made.
  ASSERT_EQ(std::system("command -v promtool >/dev/null 2>&1"), 0)
      << "promtool not found (scripts/install-deps.sh installs the prometheus package)";
  const std::string path = ::testing::TempDir() + "merged_metrics.txt";
  std::ofstream(path) << merge_expositions(three_ranks());
  const int rc = std::system(("promtool check metrics < " + path).c_str());
  EXPECT_EQ(rc, 0) << "promtool rejected " << path;
}

}  // namespace
}  // namespace kt
