// Extractive QA from a corpus: wh-word questions from the corpus's own sentences.
#include "io/data/squad_qa_gen.hpp"

#include "io/data/squad_rng.hpp"
#include "io/data/squad_text.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_set>

namespace dsa::data {
namespace {

enum kind : int { who, what, when, where, how_many };

struct word {
  std::size_t begin = 0, end = 0;           // the whitespace-separated word
  std::size_t core_begin = 0, core_end = 0; // without leading/trailing ASCII punctuation
  std::string core;
  bool trailing_punctuation = false; // the word ends in punctuation (a phrase boundary)
};

bool is_ascii_alnum(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
// Non-ASCII bytes count as letters so UTF-8 words keep their characters.
bool is_core_char(unsigned char c) {
  return c >= 0x80 || is_ascii_alnum(c);
}

std::vector<word> split_words(std::string_view s) {
  std::vector<word> words;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
    if (i >= s.size())
      break;
    word w;
    w.begin = i;
    while (i < s.size() && !(s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
    w.end = i;
    w.core_begin = w.begin;
    w.core_end = w.end;
    while (w.core_begin < w.core_end && !is_core_char(static_cast<unsigned char>(s[w.core_begin])))
      ++w.core_begin;
    while (w.core_end > w.core_begin &&
           !is_core_char(static_cast<unsigned char>(s[w.core_end - 1])))
      --w.core_end;
    w.core = std::string(s.substr(w.core_begin, w.core_end - w.core_begin));
    w.trailing_punctuation = w.core_end < w.end;
    words.push_back(std::move(w));
  }
  return words;
}

bool in_list(const std::string& w, std::initializer_list<const char*> list) {
  for (const char* item : list)
    if (w == item)
      return true;
  return false;
}

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z')
      c = static_cast<char>(c + 32);
  return s;
}

bool is_digits(const std::string& w) {
  return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
}
// 12, 1,000, 3.5
bool is_number(const std::string& w) {
  if (w.empty() || !(w.front() >= '0' && w.front() <= '9') || !(w.back() >= '0' && w.back() <= '9'))
    return false;
  return std::all_of(w.begin(), w.end(),
                     [](char c) { return (c >= '0' && c <= '9') || c == ',' || c == '.'; });
}
bool is_year(const std::string& w) {
  if (w.size() != 4 || !is_digits(w))
    return false;
  int v = std::stoi(w);
  return v >= 1000 && v <= 2099;
}
bool is_day(const std::string& w) {
  if (w.empty() || w.size() > 2 || !is_digits(w))
    return false;
  int v = std::stoi(w);
  return v >= 1 && v <= 31;
}
bool is_month(const std::string& w) {
  return in_list(w, {"January", "February", "March", "April", "May", "June", "July", "August",
                     "September", "October", "November", "December"});
}
bool is_weekday(const std::string& w) {
  return in_list(w, {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"});
}
bool is_capitalized(const std::string& w) {
  if (w.size() < 2 || !(w[0] >= 'A' && w[0] <= 'Z'))
    return false;
  return std::all_of(w.begin(), w.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '\'' || c == '-';
  });
}
bool is_lower_word(const std::string& w) {
  return !w.empty() &&
         std::all_of(w.begin(), w.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || c == '-'; }) &&
         w.front() != '-' && w.back() != '-';
}

bool is_stopword(const std::string& w) {
  static const std::unordered_set<std::string> words = {
      "about",    "above",      "after",   "again",      "against",   "almost",  "along",
      "already",  "although",   "always",  "among",      "another",   "anyone",  "anything",
      "around",   "because",    "become",  "became",     "before",    "being",   "below",
      "between",  "beyond",     "cannot",  "could",      "didn't",    "doesn't", "during",
      "either",   "enough",     "every",   "everything", "first",     "further", "given",
      "going",    "great",      "having",  "herself",    "himself",   "however", "itself",
      "large",    "later",      "least",   "little",     "might",     "myself",  "never",
      "nothing",  "often",      "other",   "others",     "ourselves", "perhaps", "quite",
      "rather",   "really",     "right",   "second",     "seemed",    "seems",   "shall",
      "should",   "since",      "small",   "something",  "sometimes", "still",   "their",
      "theirs",   "themselves", "there",   "therefore",  "these",     "thing",   "things",
      "think",    "third",      "those",   "though",     "three",     "through", "today",
      "together", "toward",     "towards", "under",      "until",     "upon",    "whatever",
      "where",    "whether",    "which",   "while",      "whole",     "whose",   "within",
      "without",  "would",      "years",   "yesterday",  "yourself",  "certain", "several",
      "whom",     "every",      "another", "rather",     "point",     "place",   "times",
      "there's",  "what's",     "also",    "made",       "make",      "said",    "says",
      "much",     "many",       "more",    "most",       "such",      "than",    "that",
      "this",     "with",       "were",    "been",       "have",      "from",    "they",
      "them",     "then",       "when",    "what",       "will",      "would",   "about",
      "could",    "other"};
  return words.count(w) > 0;
}

// Capitalized only because they start a clause ("-- The results", "(2) A patient").
bool is_function_word(const std::string& w) {
  return is_stopword(w) ||
         in_list(w, {"the",  "a",     "an",  "this", "his", "her", "its", "our",  "my",
                     "your", "their", "and", "but",  "or",  "if",  "in",  "on",   "at",
                     "of",   "for",   "to",  "by",   "as",  "it",  "he",  "she",  "we",
                     "they", "you",   "no",  "not",  "so",  "all", "one", "some", "any",
                     "each", "both",  "who", "why",  "how", "yes"});
}

bool is_org_word(const std::string& w) {
  return in_list(w, {"Committee",   "Company",     "Court",      "University", "College",
                     "Church",      "County",      "Department", "House",      "Party",
                     "Association", "Corporation", "Inc",        "Bureau",     "Board",
                     "Council",     "School",      "Society",    "Club",       "Commission",
                     "Senate",      "Congress",    "Army",       "Navy",       "Administration",
                     "Institute",   "Museum",      "Hospital",   "Bank",       "Union",
                     "Office",      "Street",      "Avenue",     "River"});
}

bool is_place_preposition(const std::string& w) {
  return in_list(w, {"in", "at", "from", "near", "into", "across", "to", "outside", "inside"});
}

qa_candidate make(const std::vector<word>& words, std::size_t first, std::size_t last, int k,
                  int priority, std::size_t replace_first) {
  qa_candidate c;
  c.begin = words[first].core_begin;
  c.end = words[last].core_end;
  c.replace_begin = replace_first < first ? words[replace_first].begin : words[first].core_begin;
  c.replace_end = words[last].core_end;
  c.kind = k;
  c.priority = priority;
  return c;
}

// Dates and years: "March 4, 1961", "in 1961", "on Friday".
void date_candidates(const std::vector<word>& w, std::vector<qa_candidate>& out) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::string& c = w[i].core;
    std::string before = i > 0 ? lower_ascii(w[i - 1].core) : "";
    bool time_prep =
        in_list(before, {"in", "on", "during", "since", "until", "by", "after", "before"});
    std::size_t rep = time_prep && !w[i - 1].trailing_punctuation ? i - 1 : i;
    if (is_month(c)) {
      std::size_t last = i;
      if (!w[last].trailing_punctuation && last + 1 < w.size() && is_day(w[last + 1].core))
        ++last;
      if (last + 1 < w.size() && is_year(w[last + 1].core) &&
          (!w[last].trailing_punctuation || w[last].end - w[last].core_end == 1))
        ++last;
      if (last > i)
        out.push_back(make(w, i, last, when, 4, rep));
    } else if (is_year(c) && !(i > 0 && is_day(w[i - 1].core))) {
      qa_candidate y = make(w, i, i, when, time_prep ? 4 : 3, rep);
      if (!time_prep)
        y.wh = "what year";
      out.push_back(y);
    } else if (is_weekday(c)) {
      out.push_back(make(w, i, i, when, 2, rep));
    }
  }
}

// Counts: a number followed by a plural-looking word.
void number_candidates(const std::vector<word>& w, std::vector<qa_candidate>& out) {
  for (std::size_t i = 0; i + 1 < w.size(); ++i) {
    const std::string& c = w[i].core;
    if (!is_number(c) || is_year(c) || w[i].trailing_punctuation || w[i].core_begin != w[i].begin)
      continue;
    if (i > 0 && is_month(w[i - 1].core))
      continue;
    const std::string& next = w[i + 1].core;
    if (is_lower_word(next) && next.size() >= 3)
      out.push_back(make(w, i, i, how_many, 3, i));
  }
}

// Names: runs of capitalized words after the first word of the sentence.
void name_candidates(std::string_view s, const std::vector<word>& w,
                     std::vector<qa_candidate>& out) {
  // The sentence's first word is capitalized anyway; it may follow "--" or "(1)".
  std::size_t i = 0;
  auto has_letter = [](const std::string& x) {
    return std::any_of(x.begin(), x.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
    });
  };
  while (i < w.size() && !has_letter(w[i].core))
    ++i;
  ++i;
  while (i < w.size()) {
    const std::string& c = w[i].core;
    if (!is_capitalized(c) || is_month(c) || is_weekday(c) || w[i].core_begin != w[i].begin ||
        is_function_word(lower_ascii(c))) {
      ++i;
      continue;
    }
    if (c.size() >= 2 && c[0] == 'I' && c[1] == '\'') { // I'm, I'll
      ++i;
      continue;
    }
    // A title or an initial ends in '.' without ending the name: "Mr. John F. Kennedy".
    auto abbreviation = [&](std::size_t k) {
      const std::string& x = w[k].core;
      bool one_dot = w[k].end == w[k].core_end + 1 && s[w[k].core_end] == '.';
      return one_dot && ((x.size() == 1 && x[0] >= 'A' && x[0] <= 'Z') ||
                         in_list(x, {"Mr", "Mrs", "Ms", "Dr", "St", "Gov", "Sen", "Rep", "Gen",
                                     "Col", "Lt", "Capt", "Prof", "Rev", "Jr", "Sgt", "Maj"}));
    };
    auto name_word = [&](std::size_t k) {
      return w[k].core_begin == w[k].begin && !is_month(w[k].core) &&
             (is_capitalized(w[k].core) || abbreviation(k));
    };
    std::size_t last = i;
    while ((!w[last].trailing_punctuation || abbreviation(last)) && last + 1 < w.size() &&
           last - i < 3 && name_word(last + 1))
      ++last;
    std::string before = lower_ascii(w[i - 1].core);
    bool prep = is_place_preposition(before) && !w[i - 1].trailing_punctuation;
    bool determiner = in_list(before, {"the", "a", "an", "this", "his", "her", "their", "its"}) &&
                      !w[i - 1].trailing_punctuation;
    std::string tail = w[last].core;
    auto ends_with = [&](const char* suffix) {
      std::size_t n = std::strlen(suffix);
      return tail.size() > n && tail.compare(tail.size() - n, n, suffix) == 0;
    };
    bool adjective = last == i && !w[last].trailing_punctuation && last + 1 < w.size() &&
                     is_lower_word(w[last + 1].core) &&
                     (ends_with("an") || ends_with("ese") || ends_with("ish") || ends_with("ic"));
    // "the European war": a nationality adjective, not a name.
    if (adjective) {
      i = last + 1;
      continue;
    }
    if (determiner)
      out.push_back(make(w, i, last, what, 2, i - 1));
    else if (is_org_word(tail) && !prep)
      out.push_back(make(w, i, last, what, 2, i));
    else if (prep && before != "to")
      out.push_back(make(w, i, last, where, 3, i - 1));
    else if (!prep)
      out.push_back(make(w, i, last, who, 3, i));
    i = last + 1;
  }
}

// Content words after a determiner: "the investigation" -> "what".
void noun_candidates(const std::vector<word>& w, std::vector<qa_candidate>& out) {
  for (std::size_t i = 1; i < w.size(); ++i) {
    const std::string& c = w[i].core;
    const std::string det = lower_ascii(w[i - 1].core);
    if (w[i - 1].trailing_punctuation ||
        !in_list(det, {"the", "a", "an", "his", "her", "their", "its", "this"}))
      continue;
    if (!is_lower_word(c) || c.size() < 5 || is_stopword(c) || w[i].core_begin != w[i].begin)
      continue;
    auto ends_with = [&](const char* suffix) {
      std::size_t n = std::strlen(suffix);
      return c.size() > n && c.compare(c.size() - n, n, suffix) == 0;
    };
    if (ends_with("ly") || ends_with("ing") || ends_with("ed"))
      continue;
    out.push_back(make(w, i, i, what, 1, i - 1));
  }
}

void shuffle(std::vector<std::size_t>& v, squad_rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i)
    std::swap(v[i - 1], v[rng.below(i)]);
}

} // namespace

const char* qa_kind_name(int k) {
  static const std::array<const char*, 5> names = {"who", "what", "when", "where", "how many"};
  return k >= 0 && k < 5 ? names[static_cast<std::size_t>(k)] : "?";
}

std::vector<qa_candidate> qa_candidates(std::string_view sentence) {
  std::vector<word> words = split_words(sentence);
  std::vector<qa_candidate> out;
  date_candidates(words, out);
  number_candidates(words, out);
  name_candidates(sentence, words, out);
  noun_candidates(words, out);
  return out;
}

std::string qa_question(std::string_view sentence, const qa_candidate& c) {
  std::string q(sentence.substr(0, c.replace_begin));
  std::string wh = c.wh ? c.wh : qa_kind_name(c.kind);
  if (c.replace_begin == 0)
    wh[0] = static_cast<char>(wh[0] - 'a' + 'A'); // starts the question
  q += wh;
  q += sentence.substr(c.replace_end);
  while (!q.empty() && std::strchr(" \t.!?;:,\"'", q.back()) != nullptr)
    q.pop_back();
  q += '?';
  return q;
}

expected<qa_gen_result> generate_qa_from_corpus(const std::vector<document>& documents,
                                                const qa_gen_options& options) {
  if (!(options.dev_fraction >= 0.0 && options.dev_fraction < 1.0))
    return make_error(errc::invalid_argument, "qa-from-corpus: dev fraction {} must be in [0, 1)",
                      options.dev_fraction);
  if (options.max_questions < 0 || options.questions_per_paragraph < 1)
    return make_error(errc::invalid_argument,
                      "qa-from-corpus: max questions {} must be >= 0 and questions per "
                      "paragraph {} >= 1",
                      options.max_questions, options.questions_per_paragraph);
  squad_rng rng(options.seed);
  std::vector<std::size_t> doc_order(documents.size());
  for (std::size_t i = 0; i < doc_order.size(); ++i)
    doc_order[i] = i;
  shuffle(doc_order, rng);

  qa_gen_result result;
  std::vector<squad_article> articles;
  std::int64_t total = 0;
  auto full = [&] { return options.max_questions > 0 && total >= options.max_questions; };
  for (std::size_t d : doc_order) {
    if (full())
      break;
    const document& doc = documents[d];
    squad_article article;
    article.title = doc.id.empty() ? fmt::format("document-{}", d) : doc.id;
    for (std::size_t p = 0; p < doc.paragraphs.size() && !full(); ++p) {
      squad_paragraph paragraph;
      std::vector<std::size_t>
          starts; // byte start of each sentence in the context (npos when skipped)
      for (const auto& s : doc.paragraphs[p].sentences) {
        if (s.empty()) {
          starts.push_back(std::string::npos);
          continue;
        }
        if (!paragraph.context.empty())
          paragraph.context += ' ';
        starts.push_back(paragraph.context.size());
        paragraph.context += s;
      }
      std::vector<std::size_t> offsets = utf8_code_point_offsets(paragraph.context);
      std::vector<std::size_t> order(starts.size());
      for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      shuffle(order, rng);
      for (std::size_t s : order) {
        if (full() || static_cast<int>(paragraph.qas.size()) >= options.questions_per_paragraph)
          break;
        if (starts[s] == std::string::npos)
          continue;
        const std::string& sentence = doc.paragraphs[p].sentences[s];
        auto n_words = static_cast<int>(python_split(sentence).size());
        if (n_words < options.min_sentence_words || n_words > options.max_sentence_words)
          continue;
        std::vector<qa_candidate> cands = qa_candidates(sentence);
        if (cands.empty())
          continue;
        int best = 0;
        for (const auto& c : cands)
          best = std::max(best, c.priority);
        std::vector<const qa_candidate*> top;
        for (const auto& c : cands)
          if (c.priority == best)
            top.push_back(&c);
        const qa_candidate& c = *top[rng.below(top.size())];
        std::size_t byte_start = starts[s] + c.begin;
        squad_answer answer;
        answer.text = sentence.substr(c.begin, c.end - c.begin);
        answer.answer_start = static_cast<std::int64_t>(
            std::lower_bound(offsets.begin(), offsets.end(), byte_start) - offsets.begin());
        if (!squad_answer_matches(paragraph.context, offsets, answer))
          continue; // mid-character: never for UTF-8
        squad_question q;
        q.id = fmt::format("qg{:05d}.{:03d}.{:03d}", d, p, s);
        q.question = qa_question(sentence, c);
        q.answers.push_back(std::move(answer));
        paragraph.qas.push_back(std::move(q));
        ++result.by_kind[c.kind];
        ++total;
      }
      if (!paragraph.qas.empty())
        article.paragraphs.push_back(std::move(paragraph));
    }
    if (!article.paragraphs.empty())
      articles.push_back(std::move(article));
  }
  if (total == 0)
    return make_error(errc::invalid_argument, "qa-from-corpus: no question could be generated");

  // Documents go to dev whole, so dev questions come from text the model was not fine-tuned on.
  result.train.version = result.dev.version = "1.1";
  std::size_t n_dev = 0;
  if (options.dev_fraction > 0.0 && articles.size() >= 2) {
    n_dev =
        static_cast<std::size_t>(options.dev_fraction * static_cast<double>(articles.size()) + 0.5);
    n_dev = std::clamp<std::size_t>(n_dev, 1, articles.size() - 1);
  } else if (options.dev_fraction > 0.0 && articles.size() == 1 &&
             articles[0].paragraphs.size() >= 2) {
    // One document: split its paragraphs instead.
    auto& ps = articles[0].paragraphs;
    std::size_t k = std::clamp<std::size_t>(
        static_cast<std::size_t>(options.dev_fraction * static_cast<double>(ps.size()) + 0.5), 1,
        ps.size() - 1);
    squad_article dev_article{articles[0].title, {}};
    dev_article.paragraphs.assign(
        std::make_move_iterator(ps.end() - static_cast<std::ptrdiff_t>(k)),
        std::make_move_iterator(ps.end()));
    ps.resize(ps.size() - k);
    result.dev.articles.push_back(std::move(dev_article));
  }
  for (std::size_t i = 0; i < articles.size(); ++i)
    (i < n_dev ? result.dev : result.train).articles.push_back(std::move(articles[i]));
  return result;
}

} // namespace dsa::data
