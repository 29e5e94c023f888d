fn main() {
    eprintln!("roce-xdp: no commands yet");
}
