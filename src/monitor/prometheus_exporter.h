// The Prometheus endpoint of a run (log.metrics_port): http://HOST:PORT/metrics in
// Prometheus's text format (prometheus-cpp's serializer), served from a thread of its own
// (monitor/metrics_server.h).
// Rank 0's carries the job's figures (monitor/run_metrics.h: step, loss, rates, waits,
// counts; the restarts, the checkpoint's age and duration, the seconds since the last
// step, for an alert on a stalled job) and its machine's; the first rank of every other
// machine serves that machine's (host CPU and memory, GPUs under DCGM's metric and label
// names, so existing dashboards work). Every series is labelled with the job, the model
// and the layout. The training thread only updates a snapshot under a mutex; a scraper
// that connects and never reads holds the server thread (until its timeout), not training.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "monitor/metrics_server.h"
#include "monitor/run_metrics.h"
#include "monitor/telemetry.h"

namespace trident {

using Labels = std::vector<std::pair<std::string, std::string>>;

class PrometheusExporter {
 public:
  // Serves on every interface at `port`; UsageError naming it when it cannot be bound.
  PrometheusExporter(int port, Labels labels);
  PrometheusExporter(const PrometheusExporter&) = delete;
  ~PrometheusExporter();

  // The job's figures (rank 0): the latest values.
  void set(const std::vector<MetricValue>& values);
  // A step ended now (for trident_seconds_since_last_step).
  void step_done();
  void set_runs(int runs);
  void checkpoint_saved(double seconds_taken);
  // This machine's telemetry.
  void set_machine(const MachineSample& sample);

 private:
  class Figures;
  std::shared_ptr<Figures> figures_;
  std::unique_ptr<MetricsServer> server_;
};

// Every metric name an exporter may serve (the Grafana dashboard's test holds its queries to them).
std::vector<std::string> exported_metric_names();

}  // namespace trident
