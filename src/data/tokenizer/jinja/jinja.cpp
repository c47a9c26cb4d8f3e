// The jinja engine's public face (jinja.h): a Template parses once and renders many contexts.
#include "data/tokenizer/jinja/jinja.h"

#include "data/tokenizer/jinja/ast.h"
#include "data/tokenizer/jinja/render.h"

namespace shardlm::data::jinja {

Template::Template(const std::string& source) : program_(std::make_unique<Program>(parse(source))) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  Renderer r(false);
  return r.run(*program_, context, nullptr);
}

std::string Template::render(const nlohmann::ordered_json& context,
                             std::vector<std::pair<size_t, size_t>>* generation_spans) const {
  Renderer r(generation_spans != nullptr);
  return r.run(*program_, context, generation_spans);
}

}  // namespace shardlm::data::jinja
