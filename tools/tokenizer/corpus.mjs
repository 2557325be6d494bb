// Deterministic corpus for comparing osprey's tokenizer with a reference implementation.
// generateCorpus(count, seed) returns `count` strings drawn from the categories below with a
// seeded PRNG (mulberry32), so every run and every machine produces the same corpus.
//
// Characters whose class differs between Unicode versions or between regex engines are left out
// on purpose: U+0085 (NEL) and U+FEFF (BOM) are \s in one engine and not another, U+180E changed
// category; emoji are limited to Unicode 13 and older.

export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const cp = (...codes) => String.fromCodePoint(...codes);

const ENGLISH = `the of and to in is you that it he was for on are as with his they at be this have from
or one had by word but not what all were we when your can said there use an each which she do how
their if will up other about out many then them these so some her would make like him into time has
look two more write go see number no way could people my than first water been call who oil its now
find long down day did get come made may part tokenizer streaming inference attention latent
throughput kernel Hopper DeepSeek Transformer GPU CPU HTTP JSON API OpenAI`.split(/\s+/);
const CONTRACTIONS = ["it's", "don't", "we're", "I've", "I'm", "you'll", "he'd", "IT'S", "DON'T",
  "We'Re", "o'clock", "rock'n'roll", "'tis", "students'"];
const LATIN = `café naïve résumé Übermaß Straße größer Ärger déjà vu façade crème brûlée señor
mañana niño pingüino ¿Qué? ¡Hola! Łódź zażółć gęślą jaźń Dziękuję Tiếng Việt Nguyễn người
İstanbul ışık Şişli çiçek Ångström Smørrebrød Þórr ðe Eyjafjallajökull œuvre cœur ſ ﬁnancial
Ǆemal ǅemal`.split(/\s+/);
const LATIN_DECOMPOSED = ["cafe\u0301", "nai\u0308ve", "Ångstro\u0308m", "e\u0300\u0301\u0302",
  "n\u0303", "a\u0328\u0301"];
const CODE = [
  "def f(x):\n    return x**2 + 1\n",
  "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
  "const x = {a: 1, 'b': [2, 3], \"c\": null};\r\n",
  "#include <vector>\n#include \"tokenizer/bpe.h\"\n",
  "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
  "<div class=\"row\"><span id='x'>&nbsp;&lt;tag&gt;</span></div>",
  "if __name__ == '__main__':\n    main()\n",
  "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
  "x := map[string]int{\"a\": 1}; y <<= 2; z->next = nullptr;",
  "    \n\t\t  \n  # comment with trailing spaces   \n",
  "$ git commit -m \"fix: off-by-one\" && ./build/osprey --help | grep -i tok",
  "std::vector<std::pair<int, float>> v{{1, 2.5f}, {3, -4e-3f}};",
  "a=b+c-d*e/f%g^h|i&j~k!l?m:n;o,p.q@r#s$t`u\\v",
  "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"k\": true}}",
  "https://example.com/path/to/page?query=1&lang=en#section-2",
  "user@example.org, admin+tag@sub.domain.co.uk",
];
const CHINESE = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音众";
const CHINESE_PUNCT = ["，", "。", "、", "；", "：", "？", "！", "“", "”", "（", "）", "《", "》", "…", "—"];
const CJK_OUTSIDE_RANGE = ["龦", "鿿", "㐀", "㑇", "𠀀", "𠮷", "𪚥", "﨑", "々", "〆", "〇"];
const HIRAGANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽゃゅょっ";
const KATAKANA = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴヴャュョッー・";
const HALFWIDTH_KATAKANA = "ｱｲｳｴｵｶｷｸｹｺｻｼｽｾｿﾀﾁﾂﾃﾄﾅﾆﾇﾈﾉﾊﾋﾌﾍﾎﾏﾐﾑﾒﾓﾔﾕﾖﾗﾘﾙﾚﾛﾜｦﾝﾞﾟｰ";
const KANJI = "日本語東京大学先生時間電車新聞会社天気今日明日漢字勉強食事";
const JAPANESE_PUNCT = ["。", "、", "「", "」", "『", "』", "〜", "！", "？"];
const HANGUL_WORDS = ["안녕하세요", "감사합니다", "한국어", "토크나이저", "서울", "사랑해요", "컴퓨터", "읽다", "ㄱㄴㄷ", "ㅏㅓㅗ", "값", "닭"];
const ARABIC_WORDS = ["مرحبا", "بالعالم", "السلام", "عليكم", "اللغة", "العربية", "كِتَابٌ", "مُحَمَّد", "شكرا", "جزيلا", "٠١٢٣٤٥٦٧٨٩", "۱۲۳", "؟", "،", "ـــ"];
const EMOJI = ["😀", "😂", "🤖", "🚀", "❤️", "👍🏽", "👋🏿", "🎉", "🔥", "✅", "⚠️", "☕", "🇺🇸", "🇯🇵", "🇩🇪",
  "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "❤️‍🔥", "1️⃣", "#️⃣", "🫠", "🥲", "🧠", "🐉", "💯", "™", "©", "®", "✨"];
const NUMBERS_UNICODE = ["１２３", "²³", "¹⁰", "½", "¾", "Ⅻ", "ⅷ", "①②③", "٣", "३४५", "๑๒", "〇一二"];
const WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ",
  " \t \n", "\u00a0", "\u3000", "\u2003", "\u2009", "\u202f", "\u2028", "\u000b", "\u000c", "        "];
const SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
  "<｜Assistant｜>", "<|EOT|>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
  "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>",
  "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>", "<｜fim▁hole｜>",
  "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜place▁holder▁no▁5｜>", "<|endoftext|>", "<EOT>", "<|im_start|>",
  "<|im_end|>"];
const NEAR_SPECIALS = ["<｜User", "<｜User｜", "｜User｜>", "<think", "<think >", "</ think>", "<｜end▁of▁sentence",
  "<|User|>", "< ｜Assistant｜>", "<<｜User｜>>", "<｜User｜><｜User｜>", "<thinking>", "<think></think>"];

// Unicode blocks assigned long ago (Unicode 6 or earlier), for random "soup" strings.
const SOUP_RANGES = [[0x20, 0x7e], [0xa1, 0x17f], [0x370, 0x3ff], [0x400, 0x4ff], [0x5d0, 0x5ea],
  [0x621, 0x64a], [0x900, 0x97f], [0xe01, 0xe3a], [0x10a0, 0x10fa], [0x2010, 0x2027],
  [0x2030, 0x205e], [0x20a0, 0x20b8], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f],
  [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff01, 0xff5e],
  [0x1f300, 0x1f5ff], [0x1d400, 0x1d7ff]];

function makeGenerators(rand) {
  const int = (n) => Math.floor(rand() * n);
  const pick = (arr) => arr[int(arr.length)];
  const chars = (s) => Array.from(s);
  const repeat = (n, f) => Array.from({ length: n }, f);
  const runOf = (alphabet, lo, hi) => repeat(lo + int(hi - lo + 1), () => pick(chars(alphabet))).join("");
  const sentence = () => {
    const words = repeat(3 + int(12), () => (rand() < 0.1 ? pick(CONTRACTIONS) : pick(ENGLISH)));
    if (rand() < 0.5) words[0] = words[0][0].toUpperCase() + words[0].slice(1);
    let s = words.join(" ");
    if (rand() < 0.3) s = s.replace(" ", ", ");
    return s + pick([".", "!", "?", "...", ":", ";", "", "?!", " -", "\""]);
  };
  const number = () => {
    const kind = int(8);
    if (kind === 0) return String(int(10));
    if (kind === 1) return runOf("0123456789", 1, 40);
    if (kind === 2) return `${int(100000)}.${int(1000)}`;
    if (kind === 3) return `-${int(1e9)},${int(1000)}`;
    if (kind === 4) return `${int(1e6).toLocaleString("en-US")}`;
    if (kind === 5) return `v${int(10)}.${int(20)}.${int(100)}-rc${int(5)}`;
    if (kind === 6) return `${int(24)}:${String(int(60)).padStart(2, "0")}`;
    return `0x${int(0xffffffff).toString(16)}`;
  };
  const emojiRun = () => repeat(1 + int(5), () => pick(EMOJI)).join(rand() < 0.5 ? "" : " ");
  const soup = () => repeat(1 + int(30), () => {
    const [lo, hi] = pick(SOUP_RANGES);
    return cp(lo + int(hi - lo + 1));
  }).join("");
  const longWord = () => {
    const kind = int(5);
    if (kind === 0) return pick(["a", "z", "ab", "é", "中", "-", "=", "_", "0", "😀"]).repeat(20 + int(300));
    if (kind === 1) return runOf("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/", 50, 400) + "==";
    if (kind === 2) return runOf("0123456789abcdef", 32, 128);
    if (kind === 3) return "Pneumonoultramicroscopicsilicovolcanoconiosis".repeat(1 + int(4));
    return runOf("abcdefghijklmnopqrstuvwxyz", 30, 200);
  };
  const categories = {
    english: () => repeat(1 + int(4), sentence).join(rand() < 0.7 ? " " : "\n"),
    latin: () => repeat(2 + int(10), () => (rand() < 0.15 ? pick(LATIN_DECOMPOSED) : pick(LATIN))).join(pick([" ", " ", ", ", "\n"])),
    code: () => repeat(1 + int(3), () => pick(CODE)).join(pick(["", "\n", "\r\n", "\n\n"])),
    chinese: () => repeat(1 + int(5), () => runOf(CHINESE, 1, 25) + (rand() < 0.2 ? pick(CJK_OUTSIDE_RANGE) : "") + pick(CHINESE_PUNCT)).join(rand() < 0.2 ? " " : ""),
    japanese: () => repeat(1 + int(5), () => pick([() => runOf(HIRAGANA, 1, 8), () => runOf(KATAKANA, 1, 8),
      () => runOf(KANJI, 1, 4), () => runOf(HALFWIDTH_KATAKANA, 1, 6)])() + (rand() < 0.4 ? pick(JAPANESE_PUNCT) : "")).join(""),
    korean: () => repeat(1 + int(6), () => pick(HANGUL_WORDS)).join(pick([" ", " ", ", ", ". ", "\n"])),
    arabic: () => repeat(1 + int(6), () => pick(ARABIC_WORDS)).join(" ") + pick(["", ".", " 123", "؟"]),
    emoji: () => repeat(1 + int(3), () => (rand() < 0.5 ? sentence() : "") + " " + emojiRun()).join(""),
    digits: () => repeat(1 + int(5), () => (rand() < 0.2 ? pick(NUMBERS_UNICODE) : number())).join(pick([" ", "", ", ", "+", "abc", "\n", "x"])),
    whitespace: () => repeat(2 + int(6), () => (rand() < 0.5 ? pick(WHITESPACE) : pick(ENGLISH))).join(rand() < 0.5 ? pick(WHITESPACE) : ""),
    longword: () => (rand() < 0.5 ? pick(ENGLISH) + " " : "") + longWord() + (rand() < 0.5 ? " " + pick(ENGLISH) : ""),
    special: () => repeat(1 + int(5), () => {
      const r = rand();
      if (r < 0.45) return pick(SPECIALS);
      if (r < 0.6) return pick(NEAR_SPECIALS);
      return rand() < 0.5 ? sentence() : runOf(CHINESE, 1, 6);
    }).join(pick(["", " ", "\n", "  "])),
    soup,
  };
  const names = Object.keys(categories);
  const mixed = () => repeat(2 + int(5), () => categories[pick(names)]()).join(pick(["", " ", "\n", "\t", "\r\n"]));
  return { categories, mixed, int };
}

// Returns [{category, text}], `count` items: every category in turn, then mixed ones.
export function generateCorpus(count, seed = 20240601) {
  const rand = mulberry32(seed);
  const { categories, mixed } = makeGenerators(rand);
  const names = Object.keys(categories);
  const out = [];
  for (let i = 0; i < count; ++i) {
    const slot = i % (names.length + 2);
    if (slot < names.length) {
      out.push({ category: names[slot], text: categories[names[slot]]() });
    } else {
      out.push({ category: "mixed", text: mixed() });
    }
  }
  return out;
}

// A large text for benchmarks: corpus strings joined until `bytes` UTF-8 bytes.
export function generateBenchText(bytes, seed = 7) {
  const rand = mulberry32(seed);
  const { categories, mixed } = makeGenerators(rand);
  const names = Object.keys(categories);
  const parts = [];
  let size = 0;
  const encoder = new TextEncoder();
  while (size < bytes) {
    const s = (rand() < 0.8 ? categories[names[Math.floor(rand() * names.length)]]() : mixed()) + "\n";
    parts.push(s);
    size += encoder.encode(s).length;
  }
  return parts.join("");
}
