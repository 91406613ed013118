// The streaming trace writer; see trace_writer.hpp.
#include "actors/trace/trace_writer.hpp"

#include "actors/trace/trace_file.hpp"
#include "actors/trace/trace_frame.hpp"

#include "core/log.hpp"
#include "io/net/flight_recorder.hpp"

#include <fcntl.h>

namespace dsa::actors {

namespace {

// The flight records waiting to be written (a failure's capture, a signal's request).
std::vector<std::string> pending_flights() {
  std::vector<std::string> out;
  for (const auto& r : net::flight_recorder::instance().take_pending()) out.push_back(net::encode_flight(r));
  return out;
}

} // namespace

expected<std::unique_ptr<trace_writer>>
trace_writer::open(trace_recorder& recorder, std::string path,
                   std::vector<std::pair<std::string, std::string>> info,
                   trace_writer_options options) {
  ckpt::unique_fd fd(ckpt::retry_eintr(
      [&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }));
  if (!fd.valid())
    return ckpt::sys_error("cannot create trace file", path, errno);
  std::string head = trace_file_header(trace_format_version);
  append_trace_frame(head, trace_frame_kind::names, trace_table_payload(trace_name_table()));
  append_trace_frame(head, trace_frame_kind::info, trace_info_payload(info));
  DSA_TRY(ckpt::write_all(fd, path, head.data(), head.size()));
  std::unique_ptr<trace_writer> w(
      new trace_writer(recorder, std::move(path), std::move(fd), options));
  // The actor table (and anything recorded already) before the thread starts:
  // even a run killed before the first interval leaves a readable file.
  DSA_TRY(w->flush_once());
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

trace_writer::trace_writer(trace_recorder& recorder, std::string path, ckpt::unique_fd fd,
                           trace_writer_options options)
    : recorder_(recorder), path_(std::move(path)), fd_(std::move(fd)), options_(options),
      wake_(std::make_shared<wake_state>()) {
  std::weak_ptr<wake_state> weak = wake_;
  recorder_.set_full_hook(options_.full_records, [weak] {
    if (auto w = weak.lock()) {
      {
        std::lock_guard<std::mutex> lock(w->mutex);
        w->wake = true;
      }
      w->cv.notify_one();
    }
  });
}

trace_writer::~trace_writer() {
  (void)finish();
}

void trace_writer::loop() {
  for (;;) {
    bool stop;
    {
      std::unique_lock<std::mutex> lock(wake_->mutex);
      wake_->cv.wait_for(lock, options_.interval, [&] { return wake_->wake || wake_->stop; });
      wake_->wake = false;
      stop = wake_->stop;
    }
    if (stop)
      return; // finish() writes the rest after the join
    if (status_) {
      auto written = flush_once();
      if (!written)
        status_ = written;
    }
    for (const auto& flight : pending_flights()) {
      if (!status_) break;
      auto written = append_flight(flight);
      if (!written) status_ = written;
      else log_warn("flight record written to {} (read it with: dsactor trace hang RUN)", path_);
    }
  }
}

status trace_writer::append(const std::string& bytes) {
  // One write per batch of frames: a kill leaves whole frames or one torn frame at the end.
  std::lock_guard<std::mutex> lock(append_mutex_);
  if (!fd_.valid()) return make_error(errc::io, "trace file {} is closed", path_);
  return ckpt::write_all(fd_, path_, bytes.data(), bytes.size());
}

status trace_writer::append_flight(const std::string& payload) {
  std::string frame;
  append_trace_frame(frame, trace_frame_kind::flight, payload);
  return append(frame);
}

status trace_writer::flush_once() {
  std::string out;
  // Actor names may be set at any time; write the table again when it changed.
  auto actors = recorder_.actor_names();
  if (actors != actors_) {
    append_trace_frame(out, trace_frame_kind::actors, trace_table_payload(actors));
    actors_ = std::move(actors);
  }
  batch_.clear();
  recorder_.drain(batch_);
  append_trace_records(out, batch_.data(), batch_.size());
  if (out.empty())
    return {};
  DSA_TRY(append(out));
  records_written_.fetch_add(batch_.size(), std::memory_order_relaxed);
  frames_written_.fetch_add((batch_.size() + 65535) / 65536, std::memory_order_relaxed);
  return {};
}

status trace_writer::finish() {
  if (finished_)
    return status_;
  finished_ = true;
  {
    std::lock_guard<std::mutex> lock(wake_->mutex);
    wake_->stop = true;
  }
  wake_->cv.notify_one();
  if (thread_.joinable())
    thread_.join();
  // The recorder's full hook stays: it holds only a weak reference to wake_.
  if (status_)
    status_ = flush_once();
  for (const auto& flight : pending_flights())
    if (status_) status_ = append_flight(flight);
  if (status_) {
    std::string end;
    const std::uint64_t count = records_written();
    end.append(reinterpret_cast<const char*>(&count), sizeof(count));
    std::string frame;
    append_trace_frame(frame, trace_frame_kind::end, end);
    status_ = append(frame);
  }
  if (status_)
    status_ = ckpt::fsync_fd(fd_, path_);
  status closed;
  {
    std::lock_guard<std::mutex> lock(append_mutex_);
    closed = fd_.close(path_);
  }
  if (status_ && !closed)
    status_ = closed;
  return status_;
}

} // namespace dsa::actors
