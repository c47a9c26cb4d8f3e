// The row builders of the config sections (see rows.h).
#include "train/keys/rows.h"

#include <cctype>

#include "train/config_ranges.h"
#include "util/error.h"

namespace shardlm::train::keys {

Takes takes(std::string param) { return Takes{std::move(param)}; }

Row& Row::within(double lo, double hi) {
  bound_min(lo, false);
  k_.range.has_max = true;
  k_.range.max = hi;
  return *this;
}

Row& Row::within_below(double lo, double hi) {
  within(lo, hi);
  k_.range.max_open = true;
  return *this;
}

Row& Row::whole(std::string unit) {
  k_.range.whole = true;
  k_.range.unit = std::move(unit);
  return *this;
}

Row& Row::choice(json v, std::string what) {
  k_.choices.emplace_back(std::move(v), std::move(what));
  return *this;
}

Row& Row::required(std::string fix) {
  k_.required = true, k_.fix = std::move(fix);
  return *this;
}

Row& Row::only_if(ConfigTest when, std::string doc) {
  k_.applies = when, k_.applies_doc = std::move(doc);
  return *this;
}

Row& Row::optional(std::string default_doc) {
  k_.optional = true, k_.default_doc = std::move(default_doc);
  return *this;
}

Row& Row::written_as(Getter write) {
  k_.write = write;
  return *this;
}

Row& Row::written_if(ConfigTest when) {
  k_.written = when;
  return *this;
}

Row& Row::written_if(const Takes& takes) {
  k_.written = [param = takes.param](const TrainConfig& c) { return scheduler_takes(c.scheduler.type, param); };
  return *this;
}

Row& Row::refusing(json value, std::string why) {
  auto set = k_.set;
  const std::string path = k_.path;
  k_.set = [=](TrainConfig& c, const json& v) {
    if (v == value) fail(path, " = ", v.dump(), ": ", why);
    set(c, v);
  };
  return *this;
}

Row& Row::bound_min(double v, bool open) {
  k_.range.has_min = true, k_.range.min = v, k_.range.min_open = open;
  return *this;
}

ConfigKey row_base(DeepSpeed ds, std::string path, std::string type, std::string help) {
  ConfigKey k;
  k.path = std::move(path), k.type = std::move(type), k.help = std::move(help), k.deepspeed = ds;
  return k;
}

Row custom(DeepSpeed ds, std::string path, std::string type, std::string help, TypeProblem type_problem,
           Setter set, Getter get) {
  ConfigKey k = row_base(ds, std::move(path), std::move(type), std::move(help));
  k.type_problem = type_problem, k.set = set;
  if (get) k.get = get;
  return Row(std::move(k));
}

Row alias(std::string path, std::string of) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of);
  k.help = "older name of `" + k.alias_of + "`";
  return Row(std::move(k));
}

namespace {
Row refused_by(std::string path, std::string type, std::function<bool(const json&)> harmless,
               std::string harmless_doc, std::string help, std::string why) {
  ConfigKey k = row_base(DeepSpeed::Refused, std::move(path), std::move(type), std::move(help));
  k.harmless = std::move(harmless), k.harmless_doc = std::move(harmless_doc), k.why = std::move(why);
  return Row(std::move(k));
}

std::string object_problem(const json& v) { return v.is_object() ? "" : "must be a JSON object"; }
bool never(const json&) { return false; }
bool switched_off(const json& v) { return v.is_object() && v.contains("enabled") && v["enabled"] == false; }
}  // namespace

Row refused(std::string path, std::string type, ValueTest harmless, std::string harmless_doc, std::string help,
            std::string why) {
  return refused_by(std::move(path), std::move(type), harmless, std::move(harmless_doc), std::move(help),
                    std::move(why));
}

Row only(std::string path, const json& supported, std::string help, std::string why) {
  return refused_by(std::move(path), supported.is_boolean() ? "bool" : "value",
                    [supported](const json& v) { return v == supported; }, format_config_value(supported),
                    std::move(help), std::move(why));
}

void ignore_value(TrainConfig&, const json&) {}

Row noted_section(std::string path, std::string help) {
  ConfigKey k = row_base(DeepSpeed::NoEffect, std::move(path), "object", std::move(help));
  k.type_problem = &object_problem;
  k.set = &ignore_value;
  return Row(std::move(k));
}

Row older_section(std::string path, std::string of) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of), k.type = "object";
  k.help = "older name of the `" + k.alias_of + "` section, read as it";
  k.type_problem = &object_problem;
  return Row(std::move(k));
}

Row refused_section(std::string path, std::string help, std::string why, bool can_disable) {
  return refused(std::move(path), "object", can_disable ? &switched_off : &never,
                 can_disable ? "{\"enabled\": false}" : "absent", std::move(help), std::move(why));
}

Row offload_flag(std::string path, std::string of, FieldRef<std::string> device) {
  ConfigKey k;
  k.path = std::move(path), k.deepspeed = DeepSpeed::Alias, k.alias_of = std::move(of), k.type = "bool";
  k.help = "older spelling: true is `" + k.alias_of + "` \"cpu\"";
  k.type_problem = &json_type_problem<bool>;
  k.set = [device](TrainConfig& c, const json& v) {
    if (v.get<bool>()) device(c) = "cpu";
  };
  return Row(std::move(k));
}

bool is_false(const json& v) { return v == false; }

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace shardlm::train::keys
