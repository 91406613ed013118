// Registers every protocol message type and the error category with CAF.
#include "actors/protocol/announce.hpp"

#include "actors/protocol/errors.hpp"
#include "actors/protocol/messages.hpp"

namespace dsa::actors {

void announce_protocol(caf::actor_system_config& cfg) {
  cfg.add_message_type<slot_ref>("dsa_slot_ref");
  cfg.add_message_type<produced>("dsa_produced");
  cfg.add_message_type<released>("dsa_released");
  cfg.add_message_type<step_report>("dsa_step_report");
  cfg.add_message_type<update_report>("dsa_update_report");
  cfg.add_message_type<grad_partial>("dsa_grad_partial");
  cfg.add_message_type<reduced>("dsa_reduced");
  cfg.add_message_type<reduced_early>("dsa_reduced_early");
  cfg.add_message_type<reduced_part>("dsa_reduced_part");
  cfg.add_message_type<work_done>("dsa_work_done");
  cfg.add_message_type<work_failed>("dsa_work_failed");
  cfg.add_message_type<grads_ready>("dsa_grads_ready");
  cfg.add_message_type<data_position>("dsa_data_position");
  cfg.add_message_type<nvme_request>("dsa_nvme_request");
  cfg.add_message_type<nvme_ended>("dsa_nvme_ended");
  // The templated add_error_category<T> of 0.17.6 does not compile; pass the renderer.
  cfg.add_error_category(caf::atom("dsactor"),
                         [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
                           std::string text = "dsactor: " + to_string(static_cast<runtime_errc>(code));
                           if (!ctx.empty()) text += " (" + to_string(ctx) + ")";
                           return text;
                         });
}

} // namespace dsa::actors
