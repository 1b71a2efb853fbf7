#include "differential_corpus.h"

#include <random>

#include "tokenizer/utf8.h"

namespace dsinfer::testing {
namespace {

// Code points are drawn from blocks assigned since Unicode 13 at the latest, so that the
// Unicode tables of PCRE2 and of Node's ICU agree on their properties.
struct Range {
  uint32_t lo, hi;
};

const std::vector<std::vector<Range>>& script_ranges() {
  static const std::vector<std::vector<Range>> r = {
      {{0x4E00, 0x9FA5}},                    // CJK (the pre-tokenizer's own range)
      {{0x3400, 0x4DB5}, {0x9FA6, 0x9FEF}},  // CJK outside it
      {{0x3041, 0x3096}, {0x30A1, 0x30FA}},  // kana
      {{0xAC00, 0xD7A3}, {0x1100, 0x1112}},  // Korean
      {{0x0621, 0x064A}, {0x064B, 0x0652}, {0x0660, 0x0669}},  // Arabic with marks and digits
      {{0x05D0, 0x05EA}, {0x05B0, 0x05BC}},  // Hebrew
      {{0x0905, 0x0939}, {0x093E, 0x094D}, {0x0966, 0x096F}},  // Devanagari
      {{0x0E01, 0x0E2E}, {0x0E31, 0x0E3A}, {0x0E50, 0x0E59}},  // Thai
      {{0x0410, 0x044F}},                    // Cyrillic
      {{0x0391, 0x03A9}, {0x03B1, 0x03C9}},  // Greek
      {{0x00C0, 0x00FF}, {0x0300, 0x036F}},  // Latin-1 letters and combining marks
      {{0x2000, 0x200A}, {0x3000, 0x3000}, {0x00A0, 0x00A0}},  // Unicode spaces
      {{0x2010, 0x2027}, {0x3001, 0x3011}, {0xFF01, 0xFF5E}},  // punctuation, full width
      {{0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x20A0, 0x20BF}},  // arrows, math, currency
      {{0x0660, 0x0669}, {0xFF10, 0xFF19}, {0x2160, 0x2188}, {0x00B2, 0x00B3}},  // other numbers
  };
  return r;
}

const std::vector<std::string>& fragments() {
  static const std::vector<std::string> f = {
      // sentences in many scripts
      "我们今天去公园散步，天气很好。", "東京は日本の首都です。", "カタカナとひらがなを混ぜる", "ひらがなだけ",
      "안녕하세요, 만나서 반갑습니다!", "مرحبا بالعالم، كيف حالك؟", "שלום עולם, מה שלומך?",
      "नमस्ते दुनिया, आप कैसे हैं?", "สวัสดีชาวโลก สบายดีไหม", "Привет, мир! Как дела?",
      "Γειά σου Κόσμε! Τι κάνεις;", "Ünïcödé façade naïve café", "Ελληνικά και English μαζί",
      // emoji: ZWJ families, skin tones, flags, keycaps, variation selectors
      "👨‍👩‍👧‍👦", "👩🏽‍💻", "👍🏻👍🏼👍🏽👍🏾👍🏿", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣#️⃣", "❤️‍🔥", "🧑🏿‍🤝‍🧑🏻", "😀😃😄", "✌️ ok",
      // combining marks
      "e\xCC\x81", "a\xCC\x8A\xCC\x81", "Z\xCD\x91\xCD\x97\xCC\xB3", "\xCC\x81start", "n\xCC\x83o",
      // digits
      "1", "12", "123", "1234", "1234567890", "3.14159", "2024-11-29", "1,000,000", "٣٤٥", "１２３",
      // code
      "def f(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
      "#include <vector>\n", "if x != nil {\r\n\treturn err\r\n}", "SELECT * FROM t WHERE id = 42;",
      "console.log(`${a}-${b}`);", "{\"key\": [1, 2, {\"x\": null}]}", "x=>x*2", "a.b.c().d[e]",
      "<div class=\"a\">text</div>", "$ ls -la | grep foo", "// comment\n/* block */", "'s 't 're 've 'm 'll 'd",
      // whitespace
      " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "  \t \n", "\u3000",
      // added tokens inside text
      "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>",
      "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<|EOT|>", "<｜place▁holder▁no▁5｜>",
      "<｜User", "｜>", "<｜", "<think>", "</think>",
      // plain English
      "The quick brown fox jumps over the lazy dog.", "Hello", "hello", " world", "it's", "don't!",
      "e.g.", "U.S.A.", "???", "!!!", "...", "---", "***", "@user", "#tag", "50%", "$100", "a/b/c",
  };
  return f;
}

void append_random_code_points(std::mt19937& rng, int n, std::string& out) {
  const auto& scripts = script_ranges();
  const auto& ranges = scripts[rng() % scripts.size()];
  for (int i = 0; i < n; ++i) {
    const Range& r = ranges[rng() % ranges.size()];
    tok::append_utf8(r.lo + rng() % (r.hi - r.lo + 1), out);
  }
}

void append_ascii_noise(std::mt19937& rng, int n, std::string& out) {
  static const std::string chars =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  for (int i = 0; i < n; ++i) out.push_back(chars[rng() % chars.size()]);
}

}  // namespace

std::vector<std::string> tokenizer_differential_corpus(int num_strings, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (const auto& f : fragments()) out.push_back(f);
  // Whitespace runs of every small length and mix.
  for (int n = 1; n <= 12 && static_cast<int>(out.size()) < num_strings; ++n) {
    std::string a(n, ' '), b(n, '\t'), c;
    for (int i = 0; i < n; ++i) c += (i % 2) ? "\r\n" : " ";
    out.push_back(a + "x");
    out.push_back("x" + a + "y");
    out.push_back(b + "\n" + a);
    out.push_back("x" + c + "y" + a);
  }
  // Digit runs of every length up to 20, alone and between letters.
  for (int n = 1; n <= 20; ++n) {
    std::string d;
    for (int i = 0; i < n; ++i) d.push_back(static_cast<char>('0' + (i * 7 + n) % 10));
    out.push_back(d);
    out.push_back("abc" + d + "def");
    out.push_back(" " + d + " ");
  }
  const auto& frags = fragments();
  while (static_cast<int>(out.size()) < num_strings) {
    std::string s;
    const int num_parts = 1 + static_cast<int>(rng() % 8);
    for (int p = 0; p < num_parts; ++p) {
      switch (rng() % 5) {
        case 0:
        case 1:
          s += frags[rng() % frags.size()];
          break;
        case 2:
          append_random_code_points(rng, 1 + static_cast<int>(rng() % 12), s);
          break;
        case 3:
          append_ascii_noise(rng, 1 + static_cast<int>(rng() % 16), s);
          break;
        case 4:
          s += std::string(1 + rng() % 4, " \t\n"[rng() % 3]);
          break;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace dsinfer::testing
